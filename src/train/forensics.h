// RUN_DIR/forensics/step_N/ for an alarm: what a person needs to judge it afterwards, written
// when it happens: the step's top-k samples over every rank (id, loss, decoded text), the
// per-layer gradient norms, the guard's signals and the weights as they were.
//
// Owns: only its settings. Called by: setup.cpp (built with the record) and recovery.cpp
// (write_forensics: a pause, an incident's first dropped step). Collective: every rank calls
// write() (the samples are gathered). Writes: forensics/step_N/ (samples.json, layers.json,
// signals.json, model.safetensors) from rank 0, but for ZeRO-3's weights, which every rank writes
// its part of (model.rank{r}.safetensors, checkpoint/weight_parts.h): no rank holds them whole.
// Saves: nothing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "checkpoint/tensor_file.h"
#include "data/batch.h"
#include "distributed/communicator.h"
#include "train/counters.h"
#include "train/step_values.h"

namespace keel::train {

class Forensics {
 public:
  // `comm` and `data` (which decodes the samples' tokens) outlive this object.
  Forensics(std::filesystem::path run_dir, int64_t top_k, std::vector<std::string> layer_names,
            distributed::Communicator& comm, torch::Device device, const data::BatchSource& data)
      : run_dir_(std::move(run_dir)),
        top_k_(top_k),
        layer_names_(std::move(layer_names)),
        comm_(&comm),
        device_(device),
        data_(&data) {}

  // forensics/step_N (step_N-iterK when an earlier attempt at that step wrote one). Nothing when
  // the step kept no samples. RecordError when the folder cannot be written.
  // `layer_grad_norms` in the order of the layer names; `signals` go into signals.json as they are.
  void write(const TrainCounters& at, const StepSamples& samples,
             const std::vector<double>& layer_grad_norms, const nlohmann::json& signals,
             const checkpoint::TensorMap& weights, bool weights_in_parts) const;

 private:
  std::filesystem::path run_dir_;
  int64_t top_k_;
  std::vector<std::string> layer_names_;
  distributed::Communicator* comm_;
  torch::Device device_;
  const data::BatchSource* data_;
};

}  // namespace keel::train
