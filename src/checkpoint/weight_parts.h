// Weights in parts: what a ZeRO-3 checkpoint (and the forensics of a ZeRO-3 run) holds instead of
// one model.safetensors, since no rank ever holds the whole model. Rank r writes
// model.rank{r}.safetensors with the pieces of parameters it owns, each a flat fp32 tensor named
// "<parameter>@<first element>", and, for each parameter whose first element it owns, the
// parameter's shape as "<parameter>@shape" (int64). Elements are named by parameter and position,
// not by rank, so the parts of any world size load at any other, and under any zero level.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/tensor_file.h"

namespace keel::checkpoint {

std::string piece_key(const std::string& param, int64_t first_element);
std::string shape_key(const std::string& param);
// Whether `weights` are parts (any piece or shape key) rather than whole tensors by name.
bool is_weight_parts(const TensorMap& weights);
// Whether `key` is a parameter's shape ("<parameter>@shape"): one per parameter in the parts.
bool is_shape_key(const std::string& key);

// A piece key's parameter and first element; false for any other key (a whole tensor's name, a
// shape key). CheckpointError when the part after '@' is not a position.
bool parse_piece_key(const std::string& key, std::string* param, int64_t* first);

// Copies elements [first, first + dst.numel()) of parameter `param` (flattened) into `dst`, from
// the whole tensor of that name or from its pieces; CheckpointError naming the parameter when
// they are not all there.
void copy_elements(const TensorMap& weights, const std::string& param, int64_t first,
                   torch::Tensor dst);

// Whether elements [first, first + n) of parameter `param` are in `weights` (whole or pieces).
bool covers(const TensorMap& weights, const std::string& param, int64_t first, int64_t n);

// Whole tensors by name from parts (every rank's, merged), on the CPU; whole tensors pass as
// they are. CheckpointError when a parameter's elements are not all there.
TensorMap whole_weights(const TensorMap& weights);

// The model's weight files of a checkpoint (or forensics) directory listed in `files`:
// model.safetensors, or model.rank{r}.safetensors for every rank r that wrote one.
std::vector<std::string> model_files(const std::vector<std::string>& files);

}  // namespace keel::checkpoint
