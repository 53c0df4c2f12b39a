// run.cuda_graphs: one micro-batch's forward, screen and backward captured once as a CUDA graph
// and replayed for every later micro-batch of the same shape, so the host launches one graph
// instead of hundreds of kernels and the device never waits for it. The graph reads static input
// buffers (the tokens, the screen's threshold, the accumulation divisor), which each micro-batch
// fills first, and accumulates into the same gradient tensors each time (the optimizer zeroes
// them in place instead of freeing them: Optimizer::keep_gradients). What a graph cannot hold
// makes the run, or the one micro-batch, eager, with the reason logged.
//
// Owns: the graph, its static inputs and outputs, the warm-ups left and whether the graph is off.
// Called by: setup.cpp (make_micro_graph: graph_obstacle, the graph), forward_backward.cpp
// (run_micro: run(), captured()) and cli/validate_command.cpp (graph_obstacle). Writes: nothing
// (log lines only). Saves: nothing: rebuilt at each start, which warms up and captures anew.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/schema.h"

namespace keel::train {

// What one micro-batch's forward and backward leave for the step, on the device.
struct MicroOutput {
  torch::Tensor per_sample_loss;  // (B) fp32, detached
  torch::Tensor keep;             // (B) fp32, 1 kept and 0 masked by the screen; undefined: none
  torch::Tensor loss_sum;         // () fp32: the kept samples' summed cross-entropy
  torch::Tensor kept;             // () fp32: how many samples were kept
};

// Why this run's micro-batches cannot be captured, naming the key or condition; empty when they
// can. The reasons are what a captured step could not do: read a value on the host, reduce
// gradients through a process group's hooks during the backward pass (`process_group`: the run
// has one, of any size), or replay the generator state.
std::string graph_obstacle(const config::Config& cfg, const torch::Device& device,
                           bool process_group);

class MicroGraph {
 public:
  // One micro-batch's forward, screen and backward from static inputs on the device: the tokens
  // (B, T+1), the screen's threshold (() fp32; +inf screens nothing) and the divisor of the
  // objective (() fp32: the step's micro-batch count).
  using Body = std::function<MicroOutput(
      const torch::Tensor& tokens, const torch::Tensor& threshold, const torch::Tensor& divisor)>;

  // `params`: the parameters whose gradients the body accumulates. `warmup`: micro-batches run
  // eagerly, on the capture's stream, before the capture (lazy initialisation must not happen
  // inside it).
  MicroGraph(const torch::Device& device, std::vector<torch::Tensor> params, int warmup = 3);
  ~MicroGraph();
  MicroGraph(const MicroGraph&) = delete;
  MicroGraph& operator=(const MicroGraph&) = delete;

  // Runs `body` on `tokens` (on the host): eagerly for the warm-up micro-batches, then captured
  // once and replayed. Returns nullopt, having run nothing, when this micro-batch cannot be
  // replayed (a shape other than the captured one, or a body that refused capture: the graph is
  // then off for the rest of the run); the caller runs it eagerly. A capture that CUDA
  // invalidated throws (std::runtime_error): nothing eager is sound after it.
  std::optional<MicroOutput> run(const torch::Tensor& tokens, double threshold, double divisor,
                                 const Body& body);
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::train
