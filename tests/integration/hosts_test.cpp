// One job across hosts (issue 50): two test hosts (test_hosts.h), network namespaces of this
// machine with an address and a hostname each. Where namespaces cannot be made, the tests skip
// saying so. The filesystem is shared, as a cluster's checkpoint directory is.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.h"
#include "test_hosts.h"

namespace keel::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A host's `keel launch`, in the background: its pid, its output file, and how it ended.
struct HostLaunch {
  int pid = 0;
  std::filesystem::path log;
  std::filesystem::path status;  // the exit code, written when it ends

  static HostLaunch start(const TestHosts& hosts, int host, const std::string& keel_args,
                          const std::filesystem::path& dir) {
    return run_on(hosts, host, std::string(kKeelBinary) + " " + keel_args, dir);
  }
  // Any command on host h, in the background.
  static HostLaunch run_on(const TestHosts& hosts, int host, const std::string& command,
                           const std::filesystem::path& dir) {
    HostLaunch l;
    l.log = dir / ("host" + std::to_string(host) + ".log");
    l.status = dir / ("host" + std::to_string(host) + ".status");
    const std::string cmd = "(" + hosts.on(host, command) + " > " + l.log.string() +
                            " 2>&1; echo $? > " + l.status.string() +
                            ") > /dev/null 2>&1 & echo $!";
    std::FILE* p = popen(cmd.c_str(), "r");
    if (p) {
      if (std::fscanf(p, "%d", &l.pid) != 1) l.pid = 0;
      pclose(p);
    }
    return l;
  }
  // The exit code once it ended, waiting up to `limit`; -1 if it did not end in time.
  int wait(std::chrono::seconds limit) const {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      std::ifstream f(status);
      int code = -1;
      if (f >> code) return code;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  std::string output() const {
    std::ifstream f(log);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
};

std::string launch_args(const TestHosts& hosts, int host, int port, const std::string& train) {
  return "launch --nnodes 2 --node-rank " + std::to_string(host) + " --master-addr " +
         hosts.address(0) + " --master-port " + std::to_string(port) + " --nproc 2 -- " + train;
}

std::string train_args(const ScratchDir& d, int steps, const std::string& extra = "") {
  return "train --run-dir " + d.str() + kQuickRun + " --set data.micro_batch_size=4" +
         " --set run.max_steps=" + std::to_string(steps) + extra;
}

// One job of 2 hosts x 2 ranks, rendezvous on `port`, `timeout_s` for its collectives, training
// until it is stopped: host 1's launch, then host 0's.
std::pair<HostLaunch, HostLaunch> start_job(const TestHosts& hosts, const ScratchDir& d, int port,
                                            int timeout_s, const std::string& checkpoints) {
  const std::string train = train_args(
      d, 100000, checkpoints + " --set distributed.timeout_s=" + std::to_string(timeout_s));
  HostLaunch b = HostLaunch::start(hosts, 1, launch_args(hosts, 1, port, train), d.path());
  HostLaunch a = HostLaunch::start(hosts, 0, launch_args(hosts, 0, port, train), d.path());
  return {a, b};
}

std::vector<double> losses(const std::filesystem::path& run) {
  std::vector<double> out;
  for (const auto& m : read_jsonl(run / "metrics.jsonl")) out.push_back(m["loss"].get<double>());
  return out;
}

// The 12 logged losses of the run in `two` equal, to the bit, those of the same job (train_args)
// run as 4 ranks on one host in `one`.
void expect_losses_of_one_host_of_four(const ScratchDir& two, const ScratchDir& one) {
  auto r =
      run_keel("launch --nproc 4 -- " + train_args(one, 12, " --set checkpoint.every_steps=0"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto across = losses(two.path()), local = losses(one.path());
  ASSERT_EQ(across.size(), 12u);
  EXPECT_EQ(across, local);
}

// Two hosts of two ranks train as one host of four ranks does, loss for loss to the bit: the
// rendezvous on a routed address, each rank's Gloo device on the address its host reaches the
// first host from.
TEST(Hosts, TwoHostsOfTwoRanksTrainAsOneHostOfFour) {
  TestHosts hosts;
  REQUIRE_HOSTS(hosts);
  ScratchDir two("hosts_two"), one("hosts_one");
  const std::string train = train_args(two, 12, " --set checkpoint.every_steps=0");
  const auto b = HostLaunch::start(hosts, 1, launch_args(hosts, 1, 29500, train), two.path());
  const auto a = HostLaunch::start(hosts, 0, launch_args(hosts, 0, 29500, train), two.path());
  ASSERT_EQ(a.wait(std::chrono::seconds(120)), 0) << a.output();
  ASSERT_EQ(b.wait(std::chrono::seconds(30)), 0) << b.output();
  EXPECT_NE(a.output().find("gloo over " + hosts.address(0) + ":29500, on host"), std::string::npos)
      << a.output();
  expect_losses_of_one_host_of_four(two, one);
}

// The same job under torchrun's own multi-node launch: an agent per host, its c10d rendezvous on
// the first host's address (that host's agent hosts the store: is_host), node ranks assigned by the
// rendezvous, rank 0's agent naming itself to the workers as MASTER_ADDR by its hostname (which
// each test host's /etc/hosts resolves, as a cluster's DNS does). keel's ranks join the agent's
// store; the losses equal one host's four ranks', bit for bit. Skipped without the setup's
// torchrun.
TEST(Hosts, TorchrunAcrossTwoHostsTrainsAsOneHostOfFour) {
  const std::string torchrun = setup_env_program("torchrun");
  if (torchrun.empty()) GTEST_SKIP() << "torchrun not found in the set-up's environment";
  TestHosts hosts;
  REQUIRE_HOSTS(hosts);
  ScratchDir two("hosts_torchrun"), one("hosts_torchrun_one");
  const std::string train = train_args(two, 12, " --set checkpoint.every_steps=0");
  auto agent = [&](int host) {
    return torchrun + " --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint " +
           hosts.address(0) + ":29400 --rdzv_id keel_hosts_test --rdzv_conf is_host=" +
           (host == 0 ? "true" : "false") + " --no-python " + kKeelBinary + " " + train;
  };
  const auto a = HostLaunch::run_on(hosts, 0, agent(0), two.path());
  const auto b = HostLaunch::run_on(hosts, 1, agent(1), two.path());
  ASSERT_EQ(a.wait(std::chrono::seconds(120)), 0) << a.output();
  ASSERT_EQ(b.wait(std::chrono::seconds(30)), 0) << b.output();
  expect_losses_of_one_host_of_four(two, one);
}

// A host whose link goes down mid-run: both hosts' launches end within distributed.timeout_s +
// 5 s, the first host naming the silent host's ranks and address; the newest checkpoint is a
// complete one that verifies, and the next start (here all four ranks on the first host's
// machine) resumes from it.
TEST(Hosts, AHostWhoseLinkGoesDownEndsTheJobNamingItAndTheRunResumes) {
  TestHosts hosts;
  REQUIRE_HOSTS(hosts);
  ScratchDir d("hosts_link_down");
  const int timeout_s = 8;
  const auto [a, b] = start_job(hosts, d, 29501, timeout_s, " --set checkpoint.every_steps=10");
  // Until a checkpoint past step 0 is committed.
  const auto latest = d.path() / "checkpoints" / "LATEST";
  for (int i = 0; i < 600; ++i) {
    std::ifstream f(latest);
    std::string name;
    if (f >> name && name != "step_00000000") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto down = Clock::now();
  hosts.link_down(1);
  const int code_a = a.wait(std::chrono::seconds(timeout_s + 5));
  const double seconds_a = std::chrono::duration<double>(Clock::now() - down).count();
  const int code_b = b.wait(std::chrono::seconds(timeout_s + 5));
  const double seconds_b = std::chrono::duration<double>(Clock::now() - down).count();
  ASSERT_EQ(code_a, 3) << seconds_a << " s\n" << a.output();
  ASSERT_EQ(code_b, 3) << seconds_b << " s\n" << b.output();
  EXPECT_LE(seconds_b, timeout_s + 5);
  EXPECT_NE(a.output().find("ranks 2, 3 on host"), std::string::npos) << a.output();
  EXPECT_NE(a.output().find("(" + hosts.address(1) + ") stopped answering"), std::string::npos)
      << a.output();
  EXPECT_NE(b.output().find("rank 0 on host " + hosts.address(0)), std::string::npos) << b.output();
  EXPECT_EQ(b.output().find("Exception raised from"), std::string::npos) << b.output();

  std::ifstream f(latest);
  std::string name;
  ASSERT_TRUE(f >> name);
  const auto inspect = run_keel("inspect " + (d.path() / "checkpoints" / name).string());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("verify:      OK"), std::string::npos) << inspect.output;
  const int64_t saved = std::stoll(name.substr(5));
  auto r = run_keel("launch --nproc 4 -- " +
                    train_args(d, static_cast<int>(saved) + 3,
                               " --set checkpoint.every_steps=10 --resume latest"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + (d.path() / "checkpoints" / name).string()),
            std::string::npos)
      << r.output;
}

// A host whose ranks are all killed (SIGKILL: no word, no checkpoint): the other host's ranks end
// within distributed.timeout_s + 5 s naming the dead ranks and their host.
TEST(Hosts, AHostWhoseRanksAreKilledIsNamed) {
  TestHosts hosts;
  REQUIRE_HOSTS(hosts);
  ScratchDir d("hosts_killed");
  const int timeout_s = 8;
  const auto [a, b] = start_job(hosts, d, 29502, timeout_s, " --set checkpoint.every_steps=0");
  for (int i = 0; i < 600 && read_jsonl(d.path() / "metrics.jsonl").size() < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto killed = Clock::now();
  // The ranks, children of host 1's launcher (whose command line starts with the binary).
  const auto kill = run_shell(
      "pkill -9 -P $(pgrep -f -- '^[^ ]*keel launch --nnodes 2 --node-rank "
      "1 --master-addr " +
      hosts.address(0) + " --master-port 29502')");
  ASSERT_EQ(kill.exit_code, 0) << kill.output;
  const int code_a = a.wait(std::chrono::seconds(timeout_s + 5));
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_EQ(code_a, 3) << seconds << " s\n" << a.output();
  EXPECT_NE(b.wait(std::chrono::seconds(10)), 0) << b.output();
  EXPECT_NE(a.output().find("ranks 2, 3 on host"), std::string::npos) << a.output();
  EXPECT_NE(a.output().find("(" + hosts.address(1) + ") stopped answering"), std::string::npos)
      << a.output();
}

}  // namespace
}  // namespace keel::testing
