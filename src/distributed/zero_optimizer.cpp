#include "distributed/zero_optimizer.h"

#include <algorithm>
#include <optional>
#include <regex>
#include <unordered_map>

#include "common/error.h"

namespace keel::distributed {

using torch::Tensor;

bool is_sharded_state(const std::map<std::string, Tensor>& state) {
  return state.count("zero.pieces") > 0 || state.count("rank0/zero.pieces") > 0;
}

namespace {

constexpr const char* kPieces = "zero.pieces";
constexpr const char* kParamNumel = "zero.param_numel";

Tensor int64_cpu(const Tensor& t) { return t.to(torch::kCPU, torch::kInt64).contiguous(); }

}  // namespace

ZeroOptimizer::ZeroOptimizer(const std::vector<std::pair<std::string, Tensor>>& named_params,
                             const config::OptimConfig& cfg, Communicator& comm, ShardOwner* owner)
    : Optimizer(optim::make_param_groups(named_params, cfg)),
      comm_(comm),
      owner_(owner),
      cfg_(cfg) {
  std::unordered_map<const void*, std::pair<size_t, size_t>> place;  // impl -> (group, index)
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t k = 0; k < groups_[g].params.size(); ++k)
      place[groups_[g].params[k].unsafeGetTensorImpl()] = {g, k};
  for (const auto& [name, p] : named_params) {
    if (!p.is_contiguous()) throw ConfigError("distributed.zero: " + name + " is not contiguous");
    params_.push_back(p);
    names_.push_back(name);
  }

  // What this rank owns: the owner's pieces, or (one process) every trained parameter whole.
  if (owner_) {
    for (const auto& owned : owner_->owned_pieces()) {
      Piece piece;
      piece.param = owned.param;
      piece.begin = owned.begin;
      piece.end = owned.end;
      piece.owned = owned;
      pieces_.push_back(std::move(piece));
    }
  } else {
    for (size_t i = 0; i < params_.size(); ++i) {
      Piece piece;
      piece.param = static_cast<int64_t>(i);
      piece.end = params_[i].numel();
      pieces_.push_back(std::move(piece));
    }
  }

  std::vector<optim::ParamGroup> shard(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) shard[g].weight_decay = groups_[g].weight_decay;
  torch::NoGradGuard no_grad;
  std::vector<Piece> trained;
  for (auto& piece : pieces_) {
    const auto it = place.find(params_[piece.param].unsafeGetTensorImpl());
    if (it == place.end()) continue;  // not trained (no gradient)
    const auto [g, k] = it->second;
    piece.group = g;
    piece.index = shard[g].params.size();
    piece.view = owner_ ? owner_->owned_weights(piece.owned)
                        : params_[piece.param].detach().view({-1}).narrow(0, piece.begin,
                                                                          piece.end - piece.begin);
    shard[g].names.push_back(groups_[g].names[k]);
    shard[g].params.push_back(piece.view);
    views_.push_back(piece.view);
    trained.push_back(std::move(piece));
  }
  pieces_ = std::move(trained);
  inner_ = optim::make_optimizer(std::move(shard), cfg);
}

const std::vector<Tensor>& ZeroOptimizer::attach_grads() {
  if (attached_) return views_;
  torch::NoGradGuard no_grad;
  for (auto& piece : pieces_) {
    const int64_t n = piece.end - piece.begin;
    if (owner_) {
      piece.view.mutable_grad() = owner_->reduced_grad(piece.owned);
    } else {
      const Tensor& g = params_[piece.param].grad();
      piece.view.mutable_grad() = g.defined() ? g.view({-1}).narrow(0, piece.begin, n) : Tensor();
    }
  }
  attached_ = true;
  return views_;
}

Tensor ZeroOptimizer::param_grad_norms() {
  std::vector<Tensor> grads;
  for (const auto& piece : pieces_) grads.push_back(piece.view.grad());
  return param_norms(grads);
}

Tensor ZeroOptimizer::param_norms(const std::vector<Tensor>& per_piece) {
  const auto opts = torch::dtype(torch::kFloat)
                        .device(params_.empty() ? torch::Device(torch::kCPU) : params_[0].device());
  Tensor squares = torch::zeros({static_cast<int64_t>(params_.size())}, opts);
  std::vector<Tensor> defined;
  std::vector<int64_t> owner;
  for (size_t i = 0; i < pieces_.size() && i < per_piece.size(); ++i) {
    if (!per_piece[i].defined()) continue;
    defined.push_back(per_piece[i]);
    owner.push_back(pieces_[i].param);
  }
  if (!defined.empty()) {
    const Tensor norms = torch::stack(at::_foreach_norm(defined, 2, at::kFloat));
    squares.index_add_(0, torch::tensor(owner, torch::kInt64).to(opts.device()), norms * norms);
  }
  if (comm_.is_process_group()) {
    std::vector<Tensor> one{squares};
    comm_.all_reduce_sum_(one);
    squares = one[0];
  }
  return squares.sqrt();
}

void ZeroOptimizer::step(double lr, const std::optional<Tensor>& found_inf) {
  if (!attached_) attach_grads();
  inner_->step(lr, found_inf);
  // The pieces' gradients are views of the reducer's or the model's: drop them, or they outlive
  // zero_grad.
  detach_grads();
  if (owner_) owner_->publish_update();
}

void ZeroOptimizer::zero_grad() {
  Optimizer::zero_grad();
  detach_grads();
}

void ZeroOptimizer::detach_grads() {
  for (auto& piece : pieces_) piece.view.mutable_grad().reset();
  attached_ = false;
}

const ZeroOptimizer::Piece* ZeroOptimizer::piece_of(const std::string& key,
                                                    std::string* what) const {
  static const std::regex pattern(R"(group(\d+)\.param(\d+)\.(\w+))");
  std::smatch m;
  if (!std::regex_match(key, m, pattern)) return nullptr;
  const size_t g = std::stoul(m[1]), i = std::stoul(m[2]);
  *what = m[3];
  for (const auto& piece : pieces_)
    if (piece.group == g && piece.index == i) return &piece;
  throw std::logic_error("zero: no piece for optimizer state " + key);
}

std::map<std::string, Tensor> ZeroOptimizer::state_dict() const {
  // The pieces back to back, in pieces_ order; offsets into the flat tensors.
  std::vector<int64_t> at(pieces_.size() + 1, 0);
  std::vector<int64_t> table;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    at[i + 1] = at[i] + pieces_[i].end - pieces_[i].begin;
    table.insert(table.end(), {pieces_[i].param, pieces_[i].begin, pieces_[i].end});
  }
  std::map<std::string, Tensor> out;
  for (auto& [key, t] : inner_->state_dict()) {
    std::string what;
    if (const Piece* piece = piece_of(key, &what)) {
      auto it = out.find("zero." + what);
      if (it == out.end())
        it = out.emplace("zero." + what, torch::zeros({at.back()}, t.options())).first;
      const size_t i = static_cast<size_t>(piece - pieces_.data());
      it->second.narrow(0, at[i], at[i + 1] - at[i]).copy_(t.reshape({-1}));
    } else {
      out[key] = t.clone();
    }
  }
  out[kPieces] =
      torch::tensor(table, torch::kInt64).view({static_cast<int64_t>(pieces_.size()), 3});
  std::vector<int64_t> numel;
  for (const auto& p : params_) numel.push_back(p.numel());
  out[kParamNumel] = torch::tensor(numel, torch::kInt64);
  return out;
}

namespace {

// A piece of a parameter in a saved state: where its elements start in the flat tensors of its
// prefix (a rank's file), and the parameter's elements [begin, end) it holds.
struct SavedPiece {
  std::string prefix;
  int64_t at, begin, end;
};

// Every saved piece, by parameter index, of the parts under `prefixes`; CheckpointError when a
// part was written for another model.
std::unordered_map<int64_t, std::vector<SavedPiece>> saved_pieces(
    const std::map<std::string, Tensor>& state, const std::vector<std::string>& prefixes,
    const std::vector<Tensor>& params) {
  std::unordered_map<int64_t, std::vector<SavedPiece>> saved;
  for (const auto& prefix : prefixes) {
    const auto numel_it = state.find(prefix + kParamNumel);
    const Tensor numel = numel_it == state.end() ? Tensor() : int64_cpu(numel_it->second);
    bool same = numel.defined() && numel.numel() == static_cast<int64_t>(params.size());
    for (size_t i = 0; same && i < params.size(); ++i)
      same = numel.data_ptr<int64_t>()[i] == params[i].numel();
    if (!same)
      throw CheckpointError("optimizer state: '" + prefix + kParamNumel +
                            "' does not match this model's parameters\nHINT: the model config "
                            "changed since the checkpoint was written");
    const Tensor table = int64_cpu(state.at(prefix + kPieces));
    const int64_t* row = table.data_ptr<int64_t>();
    int64_t at = 0;
    for (int64_t k = 0; k < table.size(0); ++k, row += 3) {
      saved[row[0]].push_back({prefix, at, row[1], row[2]});
      at += row[2] - row[1];
    }
  }
  return saved;
}

}  // namespace

bool ZeroOptimizer::covered_by(const std::map<std::string, Tensor>& state) const {
  if (!state.count(kPieces)) return true;
  const auto saved = saved_pieces(state, {""}, params_);
  for (const auto& piece : pieces_) {
    int64_t n = 0;
    if (const auto it = saved.find(piece.param); it != saved.end())
      for (const auto& s : it->second)
        n += std::max<int64_t>(0, std::min(piece.end, s.end) - std::max(piece.begin, s.begin));
    if (n != piece.end - piece.begin) return false;
  }
  return true;
}

void ZeroOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<std::string> prefixes;
  if (state.count(kPieces)) {
    prefixes.push_back("");
  } else {
    for (int r = 0; state.count("rank" + std::to_string(r) + "/" + kPieces); ++r)
      prefixes.push_back("rank" + std::to_string(r) + "/");
  }
  if (prefixes.empty()) {  // a plain optimizer's: as one process owning everything holds it
    if (owner_ == nullptr && comm_.world_size() == 1 && !state.empty()) {
      std::map<std::string, Tensor> flat = state;
      for (auto& [key, t] : flat) {
        std::string what;
        if (piece_of(key, &what)) t = t.reshape({-1});
      }
      inner_->load_state_dict(flat);
      return;
    }
    // Dummies of the weights' shapes on the CPU: the weights themselves may be sharded.
    std::vector<std::pair<std::string, Tensor>> shapes;
    for (size_t i = 0; i < params_.size(); ++i)
      shapes.emplace_back(names_[i], torch::zeros(params_[i].sizes(), torch::kFloat)
                                         .requires_grad_(params_[i].requires_grad()));
    SingleProcess alone;
    ZeroOptimizer whole(shapes, cfg_, alone, nullptr);
    whole.load_state_dict(state);
    load_state_dict(whole.state_dict());
    return;
  }

  const auto saved = saved_pieces(state, prefixes, params_);

  // The inner optimizer's state as it has it now, refilled from the saved pieces.
  std::map<std::string, Tensor> mine = inner_->state_dict();
  std::map<std::string, int64_t> covered;  // per kind of state: elements filled
  int64_t owned = 0;
  for (const auto& piece : pieces_) owned += piece.end - piece.begin;
  for (auto& [key, dst] : mine) {
    std::string what;
    const Piece* piece = piece_of(key, &what);
    Tensor target = dst.detach().clone();
    if (!piece) {  // per group (the step counter): a rank that held none of a group never counted
      bool found = false;
      for (const auto& prefix : prefixes) {
        auto it = state.find(prefix + key);
        if (it == state.end()) continue;
        const Tensor v = it->second.to(target.device(), target.scalar_type());
        target = found ? torch::maximum(target, v) : v.clone();
        found = true;
      }
      if (!found) throw CheckpointError("optimizer state: missing '" + key + "'");
      dst = target;
      continue;
    }
    covered.emplace(what, 0);
    Tensor flat = target.view({-1});
    static const std::vector<SavedPiece> kNone;
    const auto found_pieces = saved.find(piece->param);
    for (const auto& s : found_pieces == saved.end() ? kNone : found_pieces->second) {
      const int64_t b = std::max(piece->begin, s.begin), e = std::min(piece->end, s.end);
      if (b >= e) continue;
      auto it = state.find(s.prefix + "zero." + what);
      if (it == state.end())
        throw CheckpointError("optimizer state: missing '" + s.prefix + "zero." + what + "'");
      flat.narrow(0, b - piece->begin, e - b)
          .copy_(it->second.reshape({-1}).narrow(0, s.at + b - s.begin, e - b));
      covered[what] += e - b;
    }
    dst = target;
  }
  for (const auto& [what, n] : covered)
    if (n != owned)
      throw CheckpointError("optimizer state: the saved parts cover " + std::to_string(n) +
                            " of the " + std::to_string(owned) + " elements of zero." + what +
                            " this rank owns (a rank's optimizer file is missing?)");
  inner_->load_state_dict(mine);
}

std::map<std::string, Tensor> unsharded_state(
    const std::vector<std::pair<std::string, Tensor>>& named_params, const config::OptimConfig& cfg,
    const std::map<std::string, Tensor>& sharded_state) {
  // One process owns every parameter whole, in the plain optimizer's groups and order.
  SingleProcess alone;
  ZeroOptimizer whole(named_params, cfg, alone, nullptr);
  whole.load_state_dict(sharded_state);
  return whole.whole_state();
}

std::map<std::string, Tensor> ZeroOptimizer::whole_state() const {
  std::map<std::string, Tensor> out = inner_->state_dict();
  for (auto& [key, t] : out) {
    std::string what;
    const Piece* piece = piece_of(key, &what);
    if (!piece) continue;
    const Tensor& p = params_[piece->param];
    if (owner_ || piece->begin != 0 || piece->end != p.numel())
      throw std::logic_error("zero: whole_state of a rank that does not own everything");
    t = t.view(p.sizes());
  }
  return out;
}

std::string ZeroOptimizer::describe() const {
  const int world = comm_.world_size();
  const int level = owner_ ? owner_->zero_level() : 1;
  const char* what = level == 3   ? "weights, gradients and state"
                     : level == 2 ? "state and gradients"
                                  : "state";
  return inner_->describe() + " (zero" + std::to_string(level) + ": " + what + " sharded over " +
         std::to_string(world) + " rank" + (world == 1 ? "" : "s") + ")";
}

}  // namespace keel::distributed
