// c10d process groups behind keel's Communicator. Gloo's headers are vendored (third_party/gloo,
// at the wheel's commit); its compiled code is the one inside libtorch_cpu.so. keel touches gloo
// types only through c10d's own factory functions and pointers.
#include "distributed/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "common/error.h"
#include "common/host_name.h"
#include "common/log.h"

namespace keel::distributed {
namespace {

int int_var(const std::function<const char*(const char*)>& getenv, const char* name,
            std::optional<int> fallback = std::nullopt) {
  const char* text = getenv(name);
  if (!text || !*text) {
    if (fallback) return *fallback;
    throw UserError(std::string("environment variable ") + name +
                    " is missing; HINT: launch with `keel launch --nproc N -- train ...`, "
                    "torchrun or srun, which set it");
  }
  int value = 0;
  const std::string_view s(text);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size())
    throw UserError(std::string("environment variable ") + name + "=" + text +
                    ": must be an integer");
  return value;
}

void check_rank(const LaunchEnv& e) {
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size)
    throw UserError("rank " + std::to_string(e.rank) + " of world size " +
                    std::to_string(e.world_size) + " (from " + e.launcher +
                    "'s environment): the rank must lie in [0, world size)");
  if (e.master_port < 1 || e.master_port > 65535)
    throw UserError("MASTER_PORT=" + std::to_string(e.master_port) + ": must be in [1, 65535]");
}

// c10d's process groups differ in how they are made but serve the same collectives.
// Each rank's host under this key plus its rank, in the job's store: a silent rank is named with
// its host.
constexpr const char* kHostKey = "host/";

class ProcessGroupComm final : public Communicator {
 public:
  ProcessGroupComm(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> pg,
                   int rank, int world, std::chrono::milliseconds timeout, std::string store_host)
      : store_(std::move(store)),
        pg_(std::move(pg)),
        rank_(rank),
        world_(world),
        timeout_(timeout),
        store_host_(std::move(store_host)) {}
  // As torch.distributed.destroy_process_group: NCCL flushes and frees its communicators (and
  // says so when a program skips this). After a failed collective the group is aborted instead:
  // a peer that died would never answer a flush.
  ~ProcessGroupComm() override {
    try {
      if (failed_)
        pg_->abort();
      else
        pg_->shutdown();
    } catch (const std::exception& e) {
      log::warn("dist", "shutting down the process group: {}", e.what());
    }
  }
  bool is_process_group() const override { return true; }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_reduce_sum_(std::vector<torch::Tensor>& tensors) override {
    all_reduce(tensors, c10d::ReduceOp::SUM);
  }
  void all_reduce_max_(std::vector<torch::Tensor>& tensors) override {
    all_reduce(tensors, c10d::ReduceOp::MAX);
  }
  void broadcast_(std::vector<torch::Tensor>& tensors, int root) override {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout_;
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      wait(pg_->broadcast(one, opts), "broadcast");
    }
  }
  torch::Tensor all_gather(const torch::Tensor& tensor) override {
    auto input = tensor.dim() == 0 ? tensor.reshape({1}) : tensor.contiguous();
    auto sizes = input.sizes().vec();
    sizes[0] *= world_;
    auto output = torch::empty(sizes, input.options());
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    wait(pg_->_allgather_base(output, input, opts), "all_gather");
    return output;
  }
  void barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    wait(pg_->barrier(opts), "barrier");
  }
  std::unique_ptr<PendingWork> reduce_scatter_sum_async_(torch::Tensor input,
                                                         torch::Tensor output) override {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = timeout_;
    return std::make_unique<Pending>(*this, pg_->_reduce_scatter_base(output, input, opts),
                                     "reduce_scatter (gradient bucket)");
  }
  std::unique_ptr<PendingWork> all_gather_async_(torch::Tensor input,
                                                 torch::Tensor output) override {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    return std::make_unique<Pending>(*this, pg_->_allgather_base(output, input, opts),
                                     "all_gather (weights of a unit)");
  }
  std::unique_ptr<PendingWork> all_reduce_sum_async_(torch::Tensor flat) override {
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = timeout_;
    std::vector<at::Tensor> one{std::move(flat)};
    return std::make_unique<Pending>(*this, pg_->allreduce(one, opts),
                                     "all_reduce (gradient bucket)");
  }

  void barrier_out_of_band(const std::string& name) override {
    const std::string key = "oob_barrier/" + name;
    store_->add(key, 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    int64_t arrived = 0;
    while ((arrived = store_->add(key, 0)) < world_) {
      // Once a collective failed the job is ending: a writer thread waiting here for a dead rank
      // gives up instead of holding the process until the timeout.
      if (failed_)
        throw DistError("barrier '" + name + "' (through the store) on rank " +
                        std::to_string(rank_) + ": abandoned, the job's collectives failed");
      if (std::chrono::steady_clock::now() > deadline)
        throw DistError("barrier '" + name + "' (through the store) on rank " +
                        std::to_string(rank_) + ": " + std::to_string(arrived) + " of " +
                        std::to_string(world_) + " ranks arrived within distributed.timeout_s = " +
                        std::to_string(timeout_.count() / 1000));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  double seconds_waiting() const override { return seconds_waiting_; }
  std::string host_of(int rank) const override {
    try {
      const auto hosts = hosts_of(*store_, {rank});
      return hosts.empty() ? std::string() : hosts.front();
    } catch (const std::exception&) {
      return {};
    }
  }

 private:
  struct Pending final : PendingWork {
    Pending(ProcessGroupComm& comm, c10::intrusive_ptr<c10d::Work> work, const char* what)
        : comm(comm), work(std::move(work)), what(what) {}
    void wait() override { comm.wait(work, what); }
    ProcessGroupComm& comm;
    c10::intrusive_ptr<c10d::Work> work;
    const char* what;
  };

  void all_reduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp op) {
    if (tensors.empty()) return;
    c10d::AllreduceOptions opts;
    opts.reduceOp = op;
    opts.timeout = timeout_;
    // One flat buffer per dtype: one collective instead of one per tensor.
    std::vector<at::Tensor> flat{torch::cat([&] {
      std::vector<torch::Tensor> views;
      for (auto& t : tensors) views.push_back(t.reshape({-1}));
      return views;
    }())};
    wait(pg_->allreduce(flat, opts), "all_reduce");
    int64_t offset = 0;
    for (auto& t : tensors) {
      const int64_t n = t.numel();
      t.copy_(flat[0].slice(0, offset, offset + n).view(t.sizes()));
      offset += n;
    }
  }
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    struct Count {  // counted however the wait ends
      std::chrono::steady_clock::time_point start;
      double& total;
      ~Count() {
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    } count{start, seconds_waiting_};
    try {
      work->wait(timeout_);
    } catch (const c10::Error& e) {  // its what() carries a C++ backtrace: not for the user
      fail(what, e.what_without_backtrace());
    } catch (const std::exception& e) {
      fail(what, e.what());
    }
  }
  [[noreturn]] void fail(const char* what, const std::string& cause) {
    const std::string silent = failed_ ? std::string() : silent_ranks();
    failed_ = true;
    throw DistError(std::string(what) + " across " + std::to_string(world_) +
                    " ranks failed on rank " + std::to_string(rank_) + " (" +
                    (silent.empty() ? std::string("another rank may have died") : silent) +
                    "; distributed.timeout_s = " + std::to_string(timeout_.count() / 1000) +
                    "): " + cause);
  }

  // Who stopped answering, for the message of the first failed collective. Each rank whose
  // collective fails says so in the store and gives the others kWordWait to say the same: when
  // one hangs, the others' collectives fail within moments of each other, so the ranks that say
  // nothing are the hung, stopped or dead ones, and are named. A store that does not answer (it
  // lives on rank 0) bounds the wait too. Empty when every rank spoke.
  std::string silent_ranks() const {
    using namespace std::chrono_literals;
    auto result = std::make_shared<std::promise<std::string>>();
    auto answer = result->get_future();
    std::thread([store = store_, rank = rank_, world = world_, host = store_host_, result] {
      try {
        store->set("failed/" + std::to_string(rank), std::vector<uint8_t>{1});
        std::vector<int> silent;
        const auto deadline = std::chrono::steady_clock::now() + kWordWait;
        do {
          silent.clear();
          for (int r = 0; r < world; ++r)
            if (r != rank && !store->check({"failed/" + std::to_string(r)})) silent.push_back(r);
          if (!silent.empty()) std::this_thread::sleep_for(100ms);
        } while (!silent.empty() && std::chrono::steady_clock::now() < deadline);
        std::vector<std::string> hosts;
        try {
          hosts = hosts_of(*store, silent);
        } catch (const std::exception&) {  // the ranks are named without their hosts
        }
        result->set_value(describe_silent(silent, hosts));
      } catch (const std::exception&) {
        result->set_value(rank == 0 ? std::string()
                                    : describe_silent({0}, {host}) + " (its store is gone)");
      }
    }).detach();  // it may be stuck on a store that never answers; the process is ending anyway
    if (answer.wait_for(kWordWait + 1s) != std::future_status::ready)
      return rank_ == 0 ? std::string()
                        : describe_silent({0}, {store_host_}) +
                              " (the rendezvous store it hosts does not answer)";
    return answer.get();
  }

  // The host each silent rank said it runs on at the start (kHostKey), where the store knows.
  static std::vector<std::string> hosts_of(c10d::Store& store, const std::vector<int>& silent) {
    std::vector<std::string> hosts;
    for (int r : silent) {
      const std::string key = kHostKey + std::to_string(r);
      if (!store.check({key})) {
        hosts.emplace_back();
        continue;
      }
      const auto bytes = store.get(key);
      hosts.emplace_back(bytes.begin(), bytes.end());
    }
    return hosts;
  }

  // "ranks 2, 3 on host b (10.0.0.2) stopped answering ...": the ranks grouped by host, so that a
  // host that went silent (its network, its power) is named as one.
  static std::string describe_silent(const std::vector<int>& silent,
                                     const std::vector<std::string>& hosts = {}) {
    if (silent.empty()) return {};
    std::vector<std::pair<std::string, std::vector<int>>> by_host;
    for (size_t i = 0; i < silent.size(); ++i) {
      const std::string host = i < hosts.size() ? hosts[i] : std::string();
      auto it = std::find_if(by_host.begin(), by_host.end(),
                             [&](const auto& entry) { return entry.first == host; });
      if (it == by_host.end()) it = by_host.insert(by_host.end(), {host, {}});
      it->second.push_back(silent[i]);
    }
    std::string text;
    for (const auto& [host, ranks] : by_host) {
      std::string names;
      const size_t shown = std::min<size_t>(ranks.size(), 8);
      for (size_t i = 0; i < shown; ++i) names += (i ? ", " : "") + std::to_string(ranks[i]);
      if (ranks.size() > shown) names += " and " + std::to_string(ranks.size() - shown) + " more";
      text += (text.empty() ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ") +
              names + (host.empty() ? "" : " on host " + host);
    }
    return text + " stopped answering (no word within 1 s of this rank's failure): hung, " +
           "stopped or dead";
  }

  static constexpr std::chrono::seconds kWordWait{1};

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> failed_{false};  // a collective failed: set by the training thread
  double seconds_waiting_ = 0.0;
  std::string store_host_;  // MASTER_ADDR, where rank 0 and the store are; empty on one host
};

bool is_loopback(const std::string& addr) {
  return addr == "127.0.0.1" || addr == "localhost" || addr == "::1";
}

// The address of this host that the kernel routes towards `master` from: the interface the
// other hosts reach this one through. Gloo's default device takes the hostname's address, which
// on a host with several networks (or one whose hostname resolves to another machine's view of
// it) need not be reachable from the others; empty when it cannot be told.
std::string local_address_towards(const std::string& master, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    return {};
  std::string result;
  const int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  // A UDP connect sends nothing: it only picks the route and with it the source address.
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* where =
        local.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    if (::inet_ntop(local.ss_family, where, text, sizeof text)) result = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return result;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // "gpu[003-005,007],cpu01": the first entry, with its first bracketed number.
  const size_t comma = nodelist.find(',');
  const size_t bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  const std::string prefix = nodelist.substr(0, bracket);
  const size_t end = nodelist.find_first_of("-,]", bracket + 1);
  return prefix + nodelist.substr(bracket + 1, end - bracket - 1);
}

std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  std::string_view rest(tasks_per_node);
  while (!rest.empty() && node >= 0) {
    const std::string_view entry = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), entry.size() + 1));
    int tasks = 0, repeat = 1;
    auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), tasks);
    if (ec != std::errc() || tasks < 1) return std::nullopt;
    const std::string_view suffix(end, entry.data() + entry.size() - end);
    if (!suffix.empty()) {  // "(xK)"
      if (suffix.size() < 4 || suffix.substr(0, 2) != "(x" || suffix.back() != ')')
        return std::nullopt;
      auto [e2, ec2] =
          std::from_chars(suffix.data() + 2, suffix.data() + suffix.size() - 1, repeat);
      if (ec2 != std::errc() || e2 != suffix.data() + suffix.size() - 1 || repeat < 1)
        return std::nullopt;
    }
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return std::nullopt;
}

LaunchEnv launch_env_from(const std::function<const char*(const char*)>& getenv) {
  LaunchEnv e;
  auto has = [&](const char* name) {
    const char* v = getenv(name);
    return v && *v;
  };
  if (has("WORLD_SIZE") || has("RANK")) {
    e.launcher = "torchrun";
    e.rank = int_var(getenv, "RANK");
    e.world_size = int_var(getenv, "WORLD_SIZE");
    e.local_rank = int_var(getenv, "LOCAL_RANK", e.rank);
    e.local_world_size = int_var(getenv, "LOCAL_WORLD_SIZE", e.world_size);
    if (has("MASTER_ADDR")) {  // torchrun sets it even for one rank
      e.master_addr = getenv("MASTER_ADDR");
      e.master_port = int_var(getenv, "MASTER_PORT");
    } else if (e.world_size > 1) {
      throw UserError("environment variable MASTER_ADDR is missing (WORLD_SIZE is " +
                      std::to_string(e.world_size) + "); HINT: torchrun and `keel launch` set it");
    }
    const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent && (std::string(agent) == "True" || std::string(agent) == "true" ||
                              std::string(agent) == "1");
    e.restart_count = int_var(getenv, "TORCHELASTIC_RESTART_COUNT", 0);
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS")) {
    e.launcher = "slurm";
    e.rank = int_var(getenv, "SLURM_PROCID");
    e.world_size = int_var(getenv, "SLURM_NTASKS");
    e.local_rank = int_var(getenv, "SLURM_LOCALID", 0);
    e.local_world_size = int_var(getenv, "SLURM_NTASKS_PER_NODE", e.world_size);
    for (const char* list : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      if (!has(list)) continue;  // the step's list, else the job's
      const int node = int_var(getenv, "SLURM_NODEID", 0);
      const auto tasks = slurm_tasks_on_node(getenv(list), node);
      if (!tasks)
        throw UserError(std::string("environment variable ") + list + "=" + getenv(list) +
                        " names no task count for SLURM_NODEID " + std::to_string(node) +
                        " (as \"2(x3),1\" would)");
      e.local_world_size = *tasks;
      break;
    }
    if (has("MASTER_ADDR")) {
      e.master_addr = getenv("MASTER_ADDR");
    } else if (has("SLURM_JOB_NODELIST") || has("SLURM_NODELIST")) {
      e.master_addr = first_slurm_host(
          getenv(has("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST"));
    } else if (e.world_size > 1) {
      throw UserError("environment variable SLURM_JOB_NODELIST is missing (SLURM_NTASKS is " +
                      std::to_string(e.world_size) + "); HINT: set MASTER_ADDR");
    }
    e.master_port = int_var(getenv, "MASTER_PORT", 29500);
  }
  check_rank(e);
  return e;
}

LaunchEnv launch_env() {
  return launch_env_from([](const char* name) { return std::getenv(name); });
}

std::unique_ptr<Communicator> make_process_group(const LaunchEnv& env,
                                                 const config::DistributedConfig& cfg,
                                                 const torch::Device& device) {
  // One rank needs no collectives, unless a launcher started it and the config names a backend:
  // then the group is made and used (e.g. a 1-rank NCCL check on one GPU).
  if (env.world_size <= 1 && (env.launcher == "none" || cfg.backend == config::Backend::kAuto))
    return std::make_unique<SingleProcess>();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000));
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  // Without torchrun's agent, rank 0 hosts the store; the others connect to it.
  so.isServer = !env.agent_store && env.rank == 0;
  so.numWorkers = env.agent_store ? std::nullopt : std::optional<size_t>(env.world_size);
  so.waitWorkers = false;
  so.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw UserError("rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) +
                    " (rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                    ") failed: " + e.what() +
                    "; HINT: is MASTER_PORT free, and MASTER_ADDR reachable?");
  }
  const std::string prefix = env.agent_store
                                 ? "/worker/attempt_" + std::to_string(env.restart_count)
                                 : std::string("keel");
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);

  // This rank's host, as the others will name it should it go silent (on one host, a loopback
  // MASTER_ADDR, every rank shares it: not said).
  const std::string address = is_loopback(env.master_addr)
                                  ? std::string()
                                  : local_address_towards(env.master_addr, env.master_port);
  const std::string host = host_name("?") + (address.empty() ? "" : " (" + address + ")");
  if (!is_loopback(env.master_addr))
    prefixed->set(std::string(kHostKey) + std::to_string(env.rank),
                  std::vector<uint8_t>(host.begin(), host.end()));

  config::Backend backend = cfg.backend;
  if (backend == config::Backend::kAuto)
    backend = device.is_cuda() ? config::Backend::kNccl : config::Backend::kGloo;
  c10::intrusive_ptr<c10d::Backend> pg;
  if (backend == config::Backend::kNccl) {
#ifdef USE_C10D_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world_size, opts);
#else
    throw ConfigError("distributed.backend: nccl, but this LibTorch has no NCCL; use gloo");
#endif
  } else {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // On one host (keel launch, MASTER_ADDR loopback) Gloo binds to loopback only; otherwise to
    // GLOO_SOCKET_IFNAME when set (torch's convention), else to the address this host reaches
    // MASTER_ADDR from, else to the hostname's address (Gloo's default).
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (is_loopback(env.master_addr))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else if (!address.empty())
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(address));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world_size, opts);
  }
  log::info("dist", "rank {} of {} ({} from {}), {} over {}:{}, on host {}", env.rank,
            env.world_size, env.local_rank, env.launcher, config::name_of(backend), env.master_addr,
            env.master_port, host);
  return std::make_unique<ProcessGroupComm>(prefixed, pg, env.rank, env.world_size, timeout,
                                            is_loopback(env.master_addr) ? "" : env.master_addr);
}

}  // namespace keel::distributed
