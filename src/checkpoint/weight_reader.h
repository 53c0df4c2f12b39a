// A checkpoint's weights read one parameter, or a range of its elements, at a time: what
// `keel export` uses so that a model larger than host memory exports in the memory of one tensor.
// The weights are model.safetensors, or a ZeRO-3 checkpoint's parts (model.rank{r}.safetensors,
// weight_parts.h), whose pieces are found by parameter and position; each file is checked
// against MANIFEST.json first (size and xxh3, streamed: nothing is kept).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/tensor_file.h"

namespace keel::checkpoint {

class WeightReader {
 public:
  // CheckpointError when a weight file is missing, does not match MANIFEST.json or is malformed,
  // or when a parameter's pieces do not cover it.
  explicit WeightReader(const std::filesystem::path& checkpoint_dir);

  // The weight files, for messages: DIR/model.safetensors or DIR/model.rank*.safetensors.
  const std::string& source() const { return source_; }
  // Parameters and their shapes, by name.
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  // Elements [first, first + count) of parameter `name`, flattened: a 1-D fp32 CPU tensor read
  // from the pieces (or the whole tensor) that hold them alone.
  torch::Tensor read(const std::string& name, int64_t first, int64_t count) const;
  // The whole parameter, in its shape.
  torch::Tensor read(const std::string& name) const;

 private:
  struct Source {  // a stored tensor holding elements [first, first + numel) of a parameter
    int64_t first = 0, numel = 0;
    std::filesystem::path file;
    std::shared_ptr<const SafetensorsHeader> header;
    const TensorEntry* entry = nullptr;
  };
  std::filesystem::path dir_;
  std::string source_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::vector<Source>> sources_;  // by parameter, in order of position
};

}  // namespace keel::checkpoint
