#include "train/micro_graph.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>

#include "common/log.h"

namespace keel::train {

std::string graph_obstacle(const config::Config& cfg, const torch::Device& device,
                           bool process_group) {
  if (!device.is_cuda()) return "the run is on " + device.str() + ", not on a CUDA device";
  if (process_group)
    return "a process group: its gradient reducer runs on the host during the backward pass (a "
           "graph is captured for one process without one)";
  if (cfg.distributed.zero > 0)
    return "distributed.zero: " + std::to_string(cfg.distributed.zero) +
           " (the sharded optimizer sets the gradients it owns itself)";
  if (cfg.stability.screen.low == config::LowScreen::kQuarantine)
    return "stability.screen.low: quarantine (it reads each sample's content fingerprint on the "
           "host during the step)";
  if (cfg.model.activation_checkpointing != config::ActivationCheckpointing::kNone &&
      cfg.model.dropout > 0)
    return "model.activation_checkpointing with model.dropout > 0 (the recomputation restores the "
           "generator state on the host)";
  return "";
}

namespace {

// `waiter` runs behind everything queued on `first` so far.
void wait_for(const c10::cuda::CUDAStream& first, const c10::cuda::CUDAStream& waiter) {
  c10::Event done(c10::DeviceType::CUDA);
  done.record(first);
  done.block(waiter);
}

// A message's first line: enough to say why, without a C++ backtrace.
std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

}  // namespace

struct MicroGraph::Impl {
  torch::Device device;
  std::vector<torch::Tensor> params;
  int warmup_left;
  c10::cuda::CUDAStream side;                // the warm-up's and the capture's stream
  torch::Tensor tokens, threshold, divisor;  // the static inputs
  MicroOutput outputs;                       // the graph's static outputs
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  bool off = false;
  bool shape_reported = false;

  Impl(const torch::Device& d, std::vector<torch::Tensor> p, int warmup)
      : device(d),
        params(std::move(p)),
        warmup_left(warmup),
        side(c10::cuda::getStreamFromPool(false, d.index())) {}

  MicroOutput run_on_side(const Body& body) {
    const auto current = c10::cuda::getCurrentCUDAStream(device.index());
    wait_for(current, side);
    MicroOutput out;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      out = body(tokens, threshold, divisor);
    }
    wait_for(side, current);
    // Made on the side stream, read on the current one: their memory is not reused before that.
    for (const auto* t : {&out.per_sample_loss, &out.keep, &out.loss_sum, &out.kept})
      if (t->defined()) t->record_stream(current);
    return out;
  }

  // Captures `body`: nothing runs on the device until the graph is replayed. False, with the reason
  // logged and the graph off, when the body refuses to be captured (a C++ error, the capture ended
  // cleanly). A capture CUDA invalidated cannot be ended cleanly: the generator and the allocator
  // would stay in capture mode, and no eager step would be sound after it, so that stops the run.
  bool capture(const Body& body) {
    c10::cuda::device_synchronize();
    // The warm-up's cached blocks belong to the side stream; the current stream cannot reuse them.
    c10::cuda::CUDACachingAllocator::emptyCache();
    // A gradient the capture finds undefined would be set, not accumulated, at every replay.
    for (auto& p : params)
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    const auto current = c10::cuda::getCurrentCUDAStream(device.index());
    wait_for(current, side);
    graph = std::make_unique<at::cuda::CUDAGraph>();
    std::string refused;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      graph->capture_begin();
      try {
        outputs = body(tokens, threshold, divisor);
      } catch (const std::exception& e) {
        refused = first_line(e.what());
      }
      try {
        graph->capture_end();
      } catch (const std::exception& e) {
        throw std::runtime_error("the CUDA graph capture failed (" + first_line(e.what()) + ")" +
                                 (refused.empty() ? "" : " after: " + refused) +
                                 "; set run.cuda_graphs: off to train without graphs");
      }
    }
    wait_for(side, current);
    if (!refused.empty()) {
      graph.reset();
      outputs = MicroOutput();
      off = true;
      log::warn("train", "CUDA graph capture refused, eager from here: {}", refused);
      return false;
    }
    log::info("train", "CUDA graph captured: one micro-batch's forward and backward ({} tokens)",
              tokens.numel());
    return true;
  }
};

MicroGraph::MicroGraph(const torch::Device& device, std::vector<torch::Tensor> params, int warmup)
    : impl_(std::make_unique<Impl>(device, std::move(params), warmup)) {}

MicroGraph::~MicroGraph() = default;

bool MicroGraph::captured() const { return impl_->graph != nullptr; }

std::optional<MicroOutput> MicroGraph::run(const torch::Tensor& tokens, double threshold,
                                           double divisor, const Body& body) {
  Impl& g = *impl_;
  if (g.off) return std::nullopt;
  if (!g.tokens.defined()) {
    g.tokens = torch::empty(tokens.sizes(), tokens.options().device(g.device));
    const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(g.device);
    g.threshold = torch::empty({}, fp32);
    g.divisor = torch::empty({}, fp32);
  } else if (tokens.sizes() != g.tokens.sizes() || tokens.dtype() != g.tokens.dtype()) {
    if (!g.shape_reported)
      log::info("train", "a micro-batch of shape {} runs eagerly (the CUDA graph holds {})",
                c10::str(tokens.sizes()), c10::str(g.tokens.sizes()));
    g.shape_reported = true;
    return std::nullopt;
  }
  g.tokens.copy_(tokens, /*non_blocking=*/true);
  g.threshold.fill_(threshold);
  g.divisor.fill_(divisor);
  if (g.warmup_left > 0) {
    --g.warmup_left;
    return g.run_on_side(body);
  }
  if (!g.graph && !g.capture(body)) return std::nullopt;
  g.graph->replay();
  MicroOutput out;  // copies: the next replay overwrites the graph's outputs
  out.per_sample_loss = g.outputs.per_sample_loss.clone();
  if (g.outputs.keep.defined()) out.keep = g.outputs.keep.clone();
  out.loss_sum = g.outputs.loss_sum.clone();
  out.kept = g.outputs.kept.clone();
  return out;
}

}  // namespace keel::train
