#include "train/host_read.h"

namespace keel::train {
namespace {

// The packed layout, in order: loss, grad_norm, overflow, refused, loss_scale, then the L layer
// norms, the R ranks' global norms (several ranks), the C ranks' contributions (2 each), the n
// sample losses and (screened steps) the n kept flags.
constexpr int64_t kLoss = 0, kGradNorm = 1, kOverflow = 2, kRefused = 3, kLossScale = 4,
                  kLayers = 5;

torch::Tensor one(const torch::Tensor& value, const torch::TensorOptions& dev) {
  return value.defined() ? value.reshape({1}).to(dev) : torch::zeros({1}, dev);
}

}  // namespace

HostRead::HostRead(const DeviceFigures& f)
    : layers_(f.layer_grad_norms.numel()),
      ranks_(f.rank_grad_norms.defined() ? f.rank_grad_norms.numel() : 0),
      contributions_(f.contributions.defined() ? f.contributions.size(0) : 0),
      screened_(f.kept.defined()),
      scaled_(f.loss_scale.defined()) {
  const auto dev = f.loss.options();
  std::vector<torch::Tensor> parts = {one(f.loss, dev),       one(f.grad_norm, dev),
                                      one(f.overflow, dev),   one(f.refused, dev),
                                      one(f.loss_scale, dev), f.layer_grad_norms.to(dev)};
  if (ranks_ > 0) parts.push_back(f.rank_grad_norms.to(dev));
  // fp64 (cat promotes the rest): two ranks' sums of squares may differ in their last bits.
  if (contributions_ > 0) parts.push_back(f.contributions.reshape({-1}).to(f.loss.device()));
  parts.push_back(f.sample_losses.to(dev));
  if (screened_) parts.push_back(f.kept.to(dev));
  values_ = read_.add(torch::cat(parts).to(torch::kFloat64));
  pairs_ = read_.add(f.pairs.to(torch::kInt64));
  read_.queued();
}

HostFigures HostRead::wait() {
  read_.wait();
  const torch::Tensor& packed = read_.host(values_);
  const torch::Tensor& pairs = read_.host(pairs_);
  const double* p = packed.data_ptr<double>();
  const int64_t n = pairs.size(0);
  HostFigures h;
  h.loss = p[kLoss];
  h.grad_norm = p[kGradNorm];
  h.overflow = p[kOverflow] > 0;
  h.refused_on_device = p[kRefused] > 0;
  if (scaled_) h.loss_scale = p[kLossScale];
  h.layer_grad_norms.assign(p + kLayers, p + kLayers + layers_);
  const double* ranks = p + kLayers + layers_;
  h.rank_grad_norms.assign(ranks, ranks + ranks_);
  const double* contributions = ranks + ranks_;
  for (int64_t r = 0; r < contributions_; ++r)
    h.contributions.push_back({contributions[2 * r], contributions[2 * r + 1]});
  const double* losses = contributions + 2 * contributions_;
  h.sample_losses.assign(losses, losses + n);
  for (int64_t i = 0; i < n; ++i) h.kept.push_back(!screened_ || losses[n + i] > 0.5);
  const int64_t* id_hash = pairs.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    h.ids.push_back(id_hash[2 * i]);
    h.fingerprints.push_back(id_hash[2 * i + 1]);
  }
  return h;
}

}  // namespace keel::train
