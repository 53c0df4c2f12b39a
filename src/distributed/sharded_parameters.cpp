#include "distributed/sharded_parameters.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "model/layers.h"

namespace keel::distributed {

using torch::Tensor;

namespace {

// The buffer's memory, given back or taken again. Its views (the parameters, the tensors autograd
// saved) share the storage, so they see the memory whenever it is there.
void free_memory(const Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, flat.device()));
  storage->set_nbytes(0);
}

void take_memory(const Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(flat.numel()) * flat.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

class ShardedParameters::GradHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradHook(ShardedParameters* owner, int64_t param) : owner_(owner), param_(param) {}
  void operator()(const torch::autograd::Variable&) override { owner_->on_grad_ready(param_); }

 private:
  ShardedParameters* owner_;
  int64_t param_;
};

ShardedParameters::ShardedParameters(
    Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& named_params,
    const model::ParameterUnits& units, config::ReduceDtype reduce_dtype,
    torch::ScalarType compute_type, torch::Device device, const InitialValues& initial_values)
    : comm_(comm),
      head_(units.head),
      reduce_type_(reduce_dtype == config::ReduceDtype::kBf16 ? torch::kBFloat16 : torch::kFloat),
      compute_type_(compute_type) {
  std::unordered_map<std::string, int64_t> index;
  for (const auto& [name, p] : named_params) {
    if (!p.is_contiguous() || p.scalar_type() != torch::kFloat)
      throw std::logic_error("zero 3: parameter " + name + " is not contiguous fp32");
    index[name] = static_cast<int64_t>(params_.size());
    params_.push_back(p);
    names_.push_back(name);
    shapes_.push_back(p.sizes().vec());
  }
  unit_of_.assign(params_.size(), -1);
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  torch::NoGradGuard no_grad;
  for (const auto& names : units.names) {
    Unit& u = units_.emplace_back();
    const size_t at = units_.size() - 1;
    u.read_in_backward = at >= units.weights_in_backward.size() || units.weights_in_backward[at];
    for (const auto& name : names) {
      const auto it = index.find(name);
      if (it == index.end() || unit_of_[it->second] >= 0)
        throw std::logic_error("zero 3: unit parameter " + name + " unknown or in two units");
      unit_of_[it->second] = static_cast<int64_t>(units_.size()) - 1;
      u.offsets.push_back(u.numel);
      u.params.push_back(it->second);
      u.numel += params_[it->second].numel();
    }
    u.part = std::max<int64_t>((u.numel + world - 1) / world, 1);
    const auto options = torch::dtype(torch::kFloat).device(device);
    const Tensor whole = torch::zeros({u.part * world}, options);  // the padding stays zero
    for (size_t k = 0; k < u.params.size(); ++k) {
      const Tensor& p = params_[u.params[k]];
      Tensor value = p.detach();
      if (!model::holds_memory(p)) {
        if (!initial_values)
          throw std::logic_error("zero 3: parameter " + names_[u.params[k]] + " has no values");
        value = torch::empty(p.sizes(), torch::kFloat);
        initial_values(names_[u.params[k]], value);
      }
      whole.narrow(0, u.offsets[k], p.numel()).copy_(value.reshape({-1}));
    }
    u.shard = whole.narrow(0, rank * u.part, u.part).clone();
    u.flat = compute_type_ == torch::kFloat ? whole : torch::empty_like(whole, compute_type_);
    for (size_t k = 0; k < u.params.size(); ++k) {
      Tensor& p = params_[u.params[k]];
      p.set_data(u.flat.narrow(0, u.offsets[k], p.numel()).view(p.sizes()));
    }
    u.grad_shard = torch::zeros({u.part}, options);
    free_memory(u.flat);
    // What this rank owns of the unit: elements [rank * part, (rank + 1) * part) of its buffer.
    const int64_t first = rank * u.part, last = std::min(u.numel, (rank + 1) * u.part);
    for (size_t k = 0; k < u.params.size(); ++k) {
      const int64_t o = u.offsets[k], n = params_[u.params[k]].numel();
      const int64_t from = std::max(o, first), to = std::min(o + n, last);
      if (from < to)
        owned_.push_back(
            {u.params[k], from - o, to - o, static_cast<int64_t>(units_.size()) - 1, from - first});
    }
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (unit_of_[i] < 0) throw std::logic_error("zero 3: parameter " + names_[i] + " in no unit");
  ready_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].requires_grad())
      torch::autograd::impl::set_post_acc_grad_hooks(
          params_[i], std::make_unique<GradHook>(this, static_cast<int64_t>(i)));
  for (auto& u : units_) {
    u.pending = 0;
    for (int64_t p : u.params) u.pending += params_[p].requires_grad();
  }
}

ShardedParameters::~ShardedParameters() {
  release_all();
  for (auto& p : params_)
    if (p.requires_grad()) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

Tensor ShardedParameters::reduced_grad(const OwnedPiece& piece) const {
  return units_[piece.part].grad_shard.narrow(0, piece.offset, piece.numel());
}

Tensor ShardedParameters::owned_weights(const OwnedPiece& piece) const {
  return units_[piece.part].shard.narrow(0, piece.offset, piece.numel());
}

int64_t ShardedParameters::gathered_units() const {
  return std::count_if(units_.begin(), units_.end(), [](const Unit& u) { return u.gathered; });
}

void ShardedParameters::note_gathered() {
  peak_gathered_ = std::max(peak_gathered_, gathered_units());
}

int64_t ShardedParameters::last_block() const { return units() - (head_ == 0 ? 1 : 2); }

int64_t ShardedParameters::next_in_forward(int64_t unit) const {
  // The head unit entered after the last block (with tied embeddings: unit 0 again) ends the pass.
  if (unit == head_ && entered_ == last_block()) return -1;
  if (unit < last_block()) return unit + 1;
  return unit == last_block() ? head_ : -1;
}

int64_t ShardedParameters::next_in_backward(int64_t unit) const {
  if (unit == head_) return last_block() >= 1 ? last_block() : -1;
  return unit - 1;
}

void ShardedParameters::gather(Unit& u) {
  if (u.gathered) return;
  take_memory(u.flat);
  u.gather_input = compute_type_ == torch::kFloat ? u.shard : u.shard.to(compute_type_);
  u.gathering = comm_.all_gather_async_(u.gather_input, u.flat);
  u.gathered = true;
  note_gathered();
}

void ShardedParameters::wait_gathered(Unit& u) {
  if (!u.gathering) return;
  auto work = std::move(u.gathering);
  work->wait();
  u.gather_input = Tensor();
}

void ShardedParameters::release(Unit& u) {
  if (!u.gathered) return;
  wait_gathered(u);
  free_memory(u.flat);
  u.gathered = false;
}

void ShardedParameters::enter(int64_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  Unit& u = units_.at(unit);
  gather(u);
  wait_gathered(u);
  if (const int64_t next = next_in_forward(unit); next >= 0) gather(units_[next]);
  entered_ = unit;
}

Tensor ShardedParameters::leave(int64_t unit, const Tensor& output) {
  const bool backward_follows = torch::GradMode::is_enabled() && output.requires_grad();
  if (backward_follows) {
    // The unit's backward pass starts once the gradient of what it produced is known.
    Tensor hooked = output;
    hooked.register_hook([this, unit](const Tensor&) { before_backward(unit); });
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!(backward_follows && unit == head_)) release(units_.at(unit));
  return output;
}

void ShardedParameters::before_backward(int64_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  Unit& u = units_.at(unit);
  if (u.reduced) return;
  if (u.read_in_backward) {
    gather(u);
    wait_gathered(u);
  }
  if (const int64_t next = next_in_backward(unit);
      next >= 0 && !units_[next].reduced && units_[next].read_in_backward)
    gather(units_[next]);
}

void ShardedParameters::arm(bool accumulate) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A step that failed mid-way may have left reductions in flight. The gathered units stay: the
  // forward pass just ran, and the head unit is kept for this backward pass.
  reset_reduction();
  reduced_in_backward_ = 0;
  accumulate_ = accumulate;
  armed_ = true;
}

void ShardedParameters::on_grad_ready(int64_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || ready_[param]) return;
  ready_[param] = true;
  Unit& u = units_[unit_of_[param]];
  if (--u.pending > 0 || u.reduced) return;
  reduce(u);
  ++reduced_in_backward_;
}

void ShardedParameters::reduce(Unit& u) {
  const int64_t world = comm_.world_size();
  u.grad_flat = torch::zeros({u.part * world}, u.shard.options().dtype(reduce_type_));
  for (size_t k = 0; k < u.params.size(); ++k) {
    Tensor& p = params_[u.params[k]];
    if (!p.grad().defined()) continue;  // zeros
    u.grad_flat.narrow(0, u.offsets[k], p.numel()).copy_(p.grad().reshape({-1}));
    p.mutable_grad().reset();  // the reduction holds it now
  }
  release(u);  // this backward pass is done with the unit's weights
  local_.add(u.grad_flat);
  u.incoming = torch::empty({u.part}, u.grad_flat.options());
  u.reducing = comm_.reduce_scatter_sum_async_(u.grad_flat, u.incoming);
  u.reduced = true;
  in_flight_.push_back(&u - units_.data());
  while (in_flight_.size() > kUnitsInFlight) {
    complete(units_[in_flight_.front()]);
    in_flight_.pop_front();
  }
}

void ShardedParameters::complete(Unit& u) {
  if (!u.reducing) return;
  auto work = std::move(u.reducing);
  work->wait();
  const Tensor mean = u.incoming.to(torch::kFloat).div_(static_cast<double>(comm_.world_size()));
  if (accumulate_)
    u.grad_shard.add_(mean);
  else
    u.grad_shard.copy_(mean);
  u.grad_flat = Tensor();
  u.incoming = Tensor();
}

void ShardedParameters::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  for (int64_t i = units() - 1; i >= 0; --i)  // the same order on every rank
    if (!units_[i].reduced) reduce(units_[i]);
  for (int64_t i : in_flight_) complete(units_[i]);
  in_flight_.clear();
  reset_reduction();  // nothing left in flight: this only resets the step's state
  release_gathered();
}

void ShardedParameters::release_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_reduction();
  release_gathered();
}

void ShardedParameters::reset_reduction() {
  for (auto& u : units_) {
    wait_quietly(u.reducing);  // the step that started it has already failed
    u.grad_flat = Tensor();
    u.incoming = Tensor();
    u.reduced = false;
    u.pending = 0;
    for (int64_t p : u.params) u.pending += params_[p].requires_grad();
  }
  in_flight_.clear();
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().reset();
  std::fill(ready_.begin(), ready_.end(), false);
  armed_ = false;
}

void ShardedParameters::release_gathered() {
  for (auto& u : units_) {
    wait_quietly(u.gathering);
    u.gather_input = Tensor();
    if (u.gathered) {
      free_memory(u.flat);
      u.gathered = false;
    }
  }
}

}  // namespace keel::distributed
