#include "dist/zero_optimizer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <unordered_map>

#include "common/error.h"

namespace keel::dist {

using torch::Tensor;

ShardRange shard_range(int64_t numel, int rank, int world) {
  const int64_t part = (numel + world - 1) / world;
  ShardRange r;
  r.begin = std::min<int64_t>(numel, part * rank);
  r.end = std::min<int64_t>(numel, part * (rank + 1));
  return r;
}

bool is_sharded_state(const std::map<std::string, Tensor>& state) {
  return state.count("zero.range") > 0 || state.count("rank0/zero.range") > 0;
}

namespace {

constexpr const char* kRange = "zero.range";

// A piece of one parameter inside this rank's range: the inner optimizer's parameter `index` of
// group `group` is a view of elements [begin, end) of the flat order.
struct Slice {
  int64_t param = 0;  // index into the model's parameters
  size_t group = 0;
  size_t index = 0;
  int64_t begin = 0;
  int64_t end = 0;
  Tensor view;  // shares the parameter's storage; its .grad is set for each step
};

// One rank's saved shard: its range and its tensors, under `prefix` in the loaded state.
struct SavedShard {
  std::string prefix;
  int64_t begin = 0, end = 0, numel = 0;
};

class ZeroOptimizer final : public optim::Optimizer {
 public:
  ZeroOptimizer(std::vector<optim::ParamGroup> groups,
                const std::vector<std::pair<std::string, Tensor>>& named_params,
                const config::OptimConfig& cfg, Communicator& comm)
      : Optimizer(std::move(groups)), comm_(comm) {
    std::unordered_map<const void*, size_t> group_of;
    for (size_t g = 0; g < groups_.size(); ++g)
      for (const auto& p : groups_[g].params) group_of[p.unsafeGetTensorImpl()] = g;
    for (const auto& [name, p] : named_params) {
      if (!group_of.count(p.unsafeGetTensorImpl())) continue;  // not trained
      if (!params_.empty() &&
          (p.scalar_type() != params_[0].scalar_type() || p.device() != params_[0].device()))
        throw ConfigError("distributed.zero: 1 needs every parameter in one dtype on one device (" +
                          name + " differs)");
      if (!p.is_contiguous()) throw ConfigError("distributed.zero: 1: " + name + " is a view");
      params_.push_back(p);
      offsets_.push_back(numel_);
      numel_ += p.numel();
    }
    range_ = shard_range(numel_, comm.rank(), comm.world_size());
    part_ = (numel_ + comm.world_size() - 1) / comm.world_size();

    std::vector<optim::ParamGroup> shard(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) shard[g].weight_decay = groups_[g].weight_decay;
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t first = offsets_[i], last = offsets_[i] + params_[i].numel();
      const int64_t b = std::max(first, range_.begin), e = std::min(last, range_.end);
      if (b >= e) continue;
      Slice s;
      s.param = static_cast<int64_t>(i);
      s.group = group_of.at(params_[i].unsafeGetTensorImpl());
      s.index = shard[s.group].params.size();
      s.begin = b;
      s.end = e;
      s.view = params_[i].detach().view(-1).narrow(0, b - first, e - b);
      shard[s.group].names.push_back(groups_[s.group].names.at(index_in_group(s.group, i)));
      shard[s.group].params.push_back(s.view);
      slices_.push_back(std::move(s));
    }
    inner_ = optim::make_optimizer(std::move(shard), cfg);
  }

  void step(double lr, const std::optional<Tensor>& found_inf) override {
    torch::NoGradGuard no_grad;
    for (auto& s : slices_) {
      const Tensor& g = params_[s.param].grad();
      s.view.mutable_grad() =
          g.defined() ? g.reshape(-1).narrow(0, s.begin - offsets_[s.param], s.end - s.begin)
                      : Tensor();
    }
    inner_->step(lr, found_inf);
    // The slices' gradients are views of the model's: drop them, or they outlive zero_grad.
    for (auto& s : slices_) s.view.mutable_grad().reset();
    if (!comm_.is_process_group()) return;  // one rank owns everything
    // Every rank's updated part, in rank order, is the whole flat order (padded to world parts).
    Tensor mine = torch::zeros({part_}, params_[0].options());
    for (const auto& s : slices_)
      mine.narrow(0, s.begin - range_.begin, s.end - s.begin).copy_(s.view);
    const Tensor all = comm_.all_gather(mine);
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].view(-1).copy_(all.narrow(0, offsets_[i], params_[i].numel()));
  }

  std::map<std::string, Tensor> state_dict() const override {
    std::map<std::string, Tensor> out;
    for (auto& [key, t] : inner_->state_dict()) {
      std::string what;
      if (const Slice* s = slice_of(key, &what)) {
        auto it = out.find("zero." + what);
        if (it == out.end())
          it = out.emplace("zero." + what, torch::zeros({range_.size()}, t.options())).first;
        it->second.narrow(0, s->begin - range_.begin, s->end - s->begin).copy_(t.reshape(-1));
      } else {
        out[key] = t.clone();
      }
    }
    out[kRange] = torch::tensor({range_.begin, range_.end, numel_}, torch::kInt64);
    return out;
  }

  void load_state_dict(const std::map<std::string, Tensor>& state) override {
    std::vector<SavedShard> shards;
    auto read_range = [&](const std::string& prefix) {
      const Tensor r = state.at(prefix + kRange).to(torch::kCPU, torch::kInt64).contiguous();
      if (r.numel() != 3)
        throw CheckpointError("optimizer state: '" + prefix + kRange + "' is not [begin, end, n]");
      const int64_t* v = r.data_ptr<int64_t>();
      if (v[2] != numel_)
        throw CheckpointError("optimizer state: the sharded state covers " + std::to_string(v[2]) +
                              " parameter elements, this model has " + std::to_string(numel_) +
                              "\nHINT: the model config changed since the checkpoint was written");
      shards.push_back({prefix, v[0], v[1], v[2]});
    };
    if (state.count(kRange)) {
      read_range("");
    } else {
      for (int r = 0; state.count("rank" + std::to_string(r) + "/" + kRange); ++r)
        read_range("rank" + std::to_string(r) + "/");
    }
    if (shards.empty())
      throw CheckpointError(
          "optimizer state: not sharded (written with distributed.zero: 0)\nHINT: resume with "
          "distributed.zero: 0, the setting it was written with");

    // The inner optimizer's state as it has it now, refilled from the shards.
    std::map<std::string, Tensor> mine = inner_->state_dict();
    std::map<std::string, int64_t> covered;  // per kind of state: elements of the range filled
    for (auto& [key, dst] : mine) {
      std::string what;
      const Slice* s = slice_of(key, &what);
      Tensor target = dst.detach().clone();
      if (!s) {  // per-group (the step counter): a rank that held none of a group never counted
        bool found = false;
        for (const auto& sh : shards) {
          auto it = state.find(sh.prefix + key);
          if (it == state.end()) continue;
          target = found ? torch::maximum(target, it->second.to(target.device()))
                         : it->second.to(target.device(), target.scalar_type()).clone();
          found = true;
        }
        if (!found) throw CheckpointError("optimizer state: missing '" + key + "'");
        dst = target;
        continue;
      }
      Tensor flat = target.view(-1);
      for (const auto& sh : shards) {
        const int64_t b = std::max(s->begin, sh.begin), e = std::min(s->end, sh.end);
        if (b >= e) continue;
        auto it = state.find(sh.prefix + "zero." + what);
        if (it == state.end() || it->second.numel() != sh.end - sh.begin)
          throw CheckpointError("optimizer state: '" + sh.prefix + "zero." + what +
                                "' is missing or does not match its range");
        flat.narrow(0, b - s->begin, e - b)
            .copy_(it->second.reshape(-1).narrow(0, b - sh.begin, e - b));
        covered[what] += e - b;
      }
      dst = target;
    }
    for (const auto& [what, n] : covered)
      if (n != range_.size())
        throw CheckpointError("optimizer state: the shards cover " + std::to_string(n) + " of " +
                              std::to_string(range_.size()) + " elements of zero." + what +
                              " this rank owns (a rank's optimizer file is missing?)");
    inner_->load_state_dict(mine);
  }

  std::string describe() const override {
    return inner_->describe() + " (zero1: state sharded over " +
           std::to_string(comm_.world_size()) + " rank" + (comm_.world_size() == 1 ? "" : "s") +
           ")";
  }

 private:
  size_t index_in_group(size_t g, size_t param) const {
    const auto& ps = groups_[g].params;
    for (size_t k = 0; k < ps.size(); ++k)
      if (ps[k].unsafeGetTensorImpl() == params_[param].unsafeGetTensorImpl()) return k;
    throw std::logic_error("zero: parameter not in its group");
  }

  // The slice a per-parameter state key "group{g}.param{i}.{what}" belongs to (and `what`), or
  // null for a per-group key.
  const Slice* slice_of(const std::string& key, std::string* what) const {
    static const std::regex pattern(R"(group(\d+)\.param(\d+)\.(\w+))");
    std::smatch m;
    if (!std::regex_match(key, m, pattern)) return nullptr;
    const size_t g = std::stoul(m[1]), i = std::stoul(m[2]);
    *what = m[3];
    for (const auto& s : slices_)
      if (s.group == g && s.index == i) return &s;
    throw std::logic_error("zero: no slice for optimizer state " + key);
  }

  Communicator& comm_;
  std::vector<Tensor> params_;  // trainable, in model order
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0;
  int64_t part_ = 0;  // elements per rank (the last rank's range may be shorter)
  ShardRange range_;
  std::vector<Slice> slices_;
  std::unique_ptr<optim::Optimizer> inner_;
};

}  // namespace

std::unique_ptr<optim::Optimizer> make_zero_optimizer(
    const std::vector<std::pair<std::string, Tensor>>& named_params, const config::OptimConfig& cfg,
    Communicator& comm) {
  return std::make_unique<ZeroOptimizer>(optim::make_param_groups(named_params, cfg), named_params,
                                         cfg, comm);
}

}  // namespace keel::dist
