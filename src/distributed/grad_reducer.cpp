#include "distributed/grad_reducer.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace keel::distributed {

class GradReducer::Hook final : public torch::autograd::PostAccumulateGradHook {
 public:
  Hook(GradReducer* reducer, int64_t param) : reducer_(reducer), param_(param) {}
  void operator()(const torch::autograd::Variable&) override { reducer_->on_ready(param_); }

 private:
  GradReducer* reducer_;
  int64_t param_;
};

GradReducer::GradReducer(Communicator& comm, std::vector<torch::Tensor> params, double bucket_mb,
                         bool sharded, bool release_grads)
    : comm_(comm),
      params_(std::move(params)),
      sharded_(sharded || release_grads),
      release_grads_(release_grads) {
  // Reverse order: the last layers' gradients are ready first. The first bucket is small (at most
  // 1 MiB, as DDP's) so that communication starts early in the backward pass.
  const double cap = bucket_mb * 1024 * 1024;
  double bucket_cap = std::min(cap, 1024.0 * 1024.0);
  bucket_of_.assign(params_.size(), -1);
  double bytes = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const auto& p = params_[i];
    if (!p.requires_grad()) continue;
    const bool fits = !buckets_.empty() && bytes < bucket_cap &&
                      buckets_.back().flat.scalar_type() == p.scalar_type() &&
                      buckets_.back().flat.device() == p.device();
    if (!fits) {
      if (!buckets_.empty()) bucket_cap = cap;
      buckets_.emplace_back();
      buckets_.back().flat = torch::empty({0}, p.options());  // dtype and device; sized below
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(i);
    bucket_of_[i] = static_cast<int64_t>(buckets_.size()) - 1;
    bytes += static_cast<double>(p.numel() * p.element_size());
  }
  const int64_t world = comm_.world_size();
  for (auto& b : buckets_) {
    b.numel = b.offsets.back() + params_[b.params.back()].numel();
    b.part = sharded_ ? (b.numel + world - 1) / world : b.numel;
    // Sharded, the padding stays zero: its part of the sum is zero and nobody owns it. Releasing
    // gradients, the buffer is made when the bucket starts and dropped once it is reduced.
    b.flat = release_grads_ ? torch::empty({0}, b.flat.options())
                            : torch::zeros({sharded_ ? b.part * world : b.numel}, b.flat.options());
    if (sharded_) b.shard = torch::zeros({b.part}, b.flat.options());
    b.pending = static_cast<int64_t>(b.params.size());
  }
  owned_ = find_owned_pieces();
  ready_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    if (bucket_of_[i] >= 0)
      torch::autograd::impl::set_post_acc_grad_hooks(
          params_[i], std::make_unique<Hook>(this, static_cast<int64_t>(i)));
}

GradReducer::~GradReducer() {
  abandon();
  for (size_t i = 0; i < params_.size(); ++i)
    if (bucket_of_[i] >= 0) torch::autograd::impl::set_post_acc_grad_hooks(params_[i], nullptr);
}

void GradReducer::arm(bool start_in_backward, bool accumulate) {
  std::lock_guard<std::mutex> lock(mutex_);
  abandon();  // a step that failed mid-way may have left buckets in flight
  started_in_backward_ = 0;
  start_in_backward_ = start_in_backward;
  accumulate_ = accumulate && release_grads_;  // ZeRO-1 reduces only the last micro-step
  armed_ = true;
}

void GradReducer::on_ready(int64_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || !start_in_backward_ || ready_[param]) return;
  ready_[param] = true;
  --buckets_[bucket_of_[param]].pending;
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
    start(buckets_[next_++]);
    ++started_in_backward_;
    // Releasing gradients, at most kBucketsInFlight flat buffers exist: the backward pass waits
    // for the oldest before it goes on, so the whole gradient is never in memory at once.
    if (release_grads_ && next_ > kBucketsInFlight)
      complete(buckets_[next_ - 1 - kBucketsInFlight]);
  }
}

void GradReducer::complete(Bucket& b) {
  if (!b.work) return;
  auto work = std::move(b.work);
  work->wait();
  const double world = comm_.world_size();
  if (accumulate_) {
    b.shard.add_(b.incoming.div_(world));
    b.incoming = torch::Tensor();
  } else {
    b.shard.div_(world);
  }
  if (release_grads_) b.flat = torch::empty({0}, b.shard.options());
}

void GradReducer::start(Bucket& b) {
  if (release_grads_) b.flat = torch::zeros({b.part * comm_.world_size()}, b.shard.options());
  for (size_t k = 0; k < b.params.size(); ++k) {
    auto& p = params_[b.params[k]];
    auto slice = b.flat.slice(0, b.offsets[k], b.offsets[k] + p.numel());
    if (p.grad().defined())
      slice.copy_(p.grad().reshape({-1}));
    else
      slice.zero_();
    if (release_grads_) p.mutable_grad().reset();  // the bucket holds it now
  }
  local_.add(b.flat);
  if (accumulate_) b.incoming = torch::empty_like(b.shard);
  b.work = sharded_ ? comm_.reduce_scatter_sum_async_(b.flat, accumulate_ ? b.incoming : b.shard)
                    : comm_.all_reduce_sum_async_(b.flat);
}

void GradReducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  const double world = comm_.world_size();
  for (auto& b : buckets_) {
    if (sharded_) {
      complete(b);
      continue;
    }
    auto work = std::move(b.work);
    work->wait();
    b.flat.div_(world);
    for (size_t k = 0; k < b.params.size(); ++k) {
      auto& p = params_[b.params[k]];
      auto slice = b.flat.slice(0, b.offsets[k], b.offsets[k] + p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(slice);
      else
        p.mutable_grad() = slice.clone();
    }
  }
  abandon();  // nothing left in flight: this only resets the step's state
}

std::vector<OwnedPiece> GradReducer::find_owned_pieces() const {
  std::vector<OwnedPiece> out;
  if (!sharded_) return out;
  const int64_t rank = comm_.rank();
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const int64_t first = rank * b.part, last = std::min(b.numel, (rank + 1) * b.part);
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int64_t o = b.offsets[k], n = params_[b.params[k]].numel();
      const int64_t from = std::max(o, first), to = std::min(o + n, last);
      if (from < to)
        out.push_back({b.params[k], from - o, to - o, static_cast<int64_t>(bi), from - first});
    }
  }
  return out;
}

torch::Tensor GradReducer::reduced_grad(const OwnedPiece& piece) const {
  return buckets_[piece.part].shard.narrow(0, piece.offset, piece.numel());
}

torch::Tensor GradReducer::owned_weights(const OwnedPiece& piece) const {
  return params_[piece.param].detach().view({-1}).narrow(0, piece.begin, piece.numel());
}

void GradReducer::all_gather_params() {
  if (!sharded_) return;
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world_size();
  // Bucket by bucket, so that no second copy of the whole model ever exists: ZeRO-1 gathers into
  // the bucket's own flat buffer (the step has used its gradients), ZeRO-2 into one of its size.
  // The gathered buffer is rank-major, which is the bucket's layout.
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    torch::Tensor mine = torch::zeros({b.part}, b.shard.options());  // padding stays zero
    for (const OwnedPiece& piece : owned_)
      if (piece.part == static_cast<int64_t>(bi))
        mine.narrow(0, piece.offset, piece.numel()).copy_(owned_weights(piece));
    torch::Tensor all = release_grads_ ? torch::empty({b.part * world}, b.shard.options()) : b.flat;
    comm_.all_gather_async_(mine, all)->wait();
    for (size_t k = 0; k < b.params.size(); ++k) {
      auto p = params_[b.params[k]].detach();
      p.view({-1}).copy_(all.narrow(0, b.offsets[k], p.numel()));
    }
  }
}

void GradReducer::abandon() {
  for (auto& b : buckets_) {
    wait_quietly(b.work);  // the step that started it has already failed
    b.pending = static_cast<int64_t>(b.params.size());
    if (release_grads_) {  // a step that failed mid-way: nothing of it may reach the next one
      b.flat = torch::empty({0}, b.shard.options());
      b.incoming = torch::Tensor();
    }
  }
  if (release_grads_)
    for (auto& p : params_)
      if (p.grad().defined()) p.mutable_grad().reset();
  std::fill(ready_.begin(), ready_.end(), false);
  next_ = 0;
  armed_ = false;
}

}  // namespace keel::distributed
