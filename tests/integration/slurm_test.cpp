// keel under a real Slurm: a one-node cluster (slurmctld, slurmd and munged from Debian's
// slurm-wlm and munge, which scripts/setup.sh installs) started on this machine for the test, with
// 2 CPUs, on loopback, and stopped after it. `srun -n 2 keel train` trains as `keel launch --nproc
// 2` does; a job that reaches its time limit under scripts/slurm/train.sbatch (--signal) writes a
// checkpoint and exits, and the same script submitted again continues bit-exactly. The test skips,
// saying why, where the daemons cannot start.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "harness.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string s = name;
  return s.substr(0, s.find('.'));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

class SlurmCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                                "/usr/bin/srun", "/usr/bin/sbatch"})
      if (!fs::exists(program))
        GTEST_SKIP() << program << " is missing: scripts/setup.sh installs slurm-wlm and munge";
    if (::geteuid() != 0) GTEST_SKIP() << "slurmd runs jobs as their user only as root here";
    const fs::path d = dir_.path();
    for (const char* sub : {"spool", "state", "log", "run"}) fs::create_directories(d / sub);
    {
      std::ofstream key(d / "munge.key", std::ios::binary);
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>((i * 7919 + ::getpid()) & 0xff));
    }
    fs::permissions(d / "munge.key", fs::perms::owner_read | fs::perms::owner_write);
    const std::string socket = (d / "run/munge.sock").string();
    auto r = run_shell("/usr/sbin/munged -f --socket=" + socket +
                       " --key-file=" + (d / "munge.key").string() +
                       " --log-file=" + (d / "log/munged.log").string() +
                       " --pid-file=" + (d / "run/munged.pid").string() +
                       " --seed-file=" + (d / "run/munged.seed").string());
    if (r.exit_code != 0) GTEST_SKIP() << "munged does not start: " << r.output;
    const std::string host = host_name();
    std::ofstream(d / "slurm.conf")
        << "ClusterName=keeltest\nSlurmctldHost=" << host << "(127.0.0.1)\n"
        << "SlurmctldPort=" << free_port() << "\nSlurmdPort=" << free_port() << "\n"
        << "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << socket << "\n"
        << "StateSaveLocation=" << (d / "state").string() << "\n"
        << "SlurmdSpoolDir=" << (d / "spool").string() << "\n"
        << "SlurmctldPidFile=" << (d / "run/slurmctld.pid").string() << "\n"
        << "SlurmdPidFile=" << (d / "run/slurmd.pid").string() << "\n"
        << "SlurmctldLogFile=" << (d / "log/slurmctld.log").string() << "\n"
        << "SlurmdLogFile=" << (d / "log/slurmd.log").string() << "\n"
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        << "ReturnToService=2\nKillWait=10\nInactiveLimit=0\nMinJobAge=300\n"
        << "NodeName=" << host
        << " NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n"
        // A second node that is down (nothing listens at its port): a job that leaves this host
        // out can still be submitted, and waits.
        << "NodeName=keelspare NodeAddr=127.0.0.1 Port=" << free_port() << " CPUs=2 State=DOWN\n"
        << "PartitionName=keel Nodes=" << host
        << ",keelspare Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
    conf_ = (d / "slurm.conf").string();
    ::setenv("SLURM_CONF", conf_.c_str(), 1);
    r = run_shell("/usr/sbin/slurmctld -f " + conf_ + " -i && /usr/sbin/slurmd -f " + conf_);
    if (r.exit_code != 0) GTEST_SKIP() << "the Slurm daemons do not start: " << r.output;
    started_ = true;
    for (int i = 0; i < 100; ++i) {
      if (run_shell("sinfo -h -o %t").output.find("idle") != std::string::npos) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    GTEST_SKIP() << "the node never became idle:\n"
                 << slurp(d / "log/slurmctld.log") << slurp(d / "log/slurmd.log");
  }

  void TearDown() override {
    const fs::path d = dir_.path();
    if (started_) run_shell("scancel --full --signal=KILL --partition=keel");
    for (const char* pid_file : {"run/slurmd.pid", "run/slurmctld.pid", "run/munged.pid"}) {
      std::ifstream in(d / pid_file);
      if (int pid = 0; in >> pid && pid > 0) ::kill(pid, SIGTERM);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::unsetenv("SLURM_CONF");
  }

  // Waits until job `id` has left the queue; false after `seconds`.
  bool wait_for_job(const std::string& id, int seconds) {
    for (int i = 0; i < seconds * 5; ++i) {
      if (run_shell("squeue -h -j " + id).output.find(id) == std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  ScratchDir dir_{"slurm_cluster"};
  std::string conf_;
  bool started_ = false;
};

// A tiny run on loopback: the embedded config, every step logged, a constant lr so that a run's
// length (run.max_steps) changes no step's lr.
std::string train_sets(int steps) {
  return kQuickRun +
         " --set data.micro_batch_size=8 --set schedule.kind=constant --set run.max_steps=" +
         std::to_string(steps) + " --set checkpoint.every_steps=1000";
}

std::string run_args(const std::string& run_dir, int steps) {
  return "--run-dir " + run_dir + train_sets(steps);
}

std::map<int64_t, double> losses_of(const fs::path& run_dir) {
  std::map<int64_t, double> out;
  for (auto& m : read_jsonl(run_dir / "metrics.jsonl"))
    out[m["step"].get<int64_t>()] = m["loss"].get<double>();
  return out;
}

TEST_F(SlurmCluster, SrunTrainsAsKeelLaunchDoes) {
  const fs::path d = dir_.path();
  const std::string port = std::to_string(free_port());
  auto r = run_shell("env MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " srun -n 2 " +
                     keel::testing::kKeelBinary + " train " + run_args((d / "srun").string(), 20));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 of 2 (0 from slurm)"), std::string::npos) << r.output;
  r = run_keel("launch --nproc 2 -- train " + run_args((d / "launch").string(), 20));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = losses_of(d / "srun"), b = losses_of(d / "launch");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
}

// scripts/slurm/train.sbatch at a one-minute time limit, SIGTERM 50 s before it: the ranks write
// one checkpoint and exit; the same script submitted again resumes and trains bit-exactly as an
// uninterrupted run.
TEST_F(SlurmCluster, ATimeLimitCheckpointsAndTheResubmittedJobContinuesBitExactly) {
  const fs::path d = dir_.path();
  const std::string script = source_path("scripts/slurm/train.sbatch");
  const std::string run = (d / "job").string();
  auto submit = [&](int steps) {
    const std::string port = std::to_string(free_port());
    auto r = run_shell("env KEEL=" + std::string(keel::testing::kKeelBinary) +
                       " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
                       " sbatch --parsable --ntasks=2 --time=1 --signal=TERM@50 --output=" +
                       (d / "job-%j.out").string() + " " + script + " " +
                       source_path("configs/tiny.yaml") + " " + run + train_sets(steps));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output.substr(0, r.output.find_first_of(";\n"));
  };
  const std::string first = submit(1000000);
  ASSERT_TRUE(wait_for_job(first, 120)) << "job " << first << " still queued or running";
  const std::string out = slurp(d / ("job-" + first + ".out"));
  const auto events = read_jsonl(fs::path(run) / "events.jsonl");
  ASSERT_FALSE(events.empty()) << out;
  ASSERT_EQ(events.back()["kind"], "interrupted") << out;
  const int64_t stopped = events.back()["step"].get<int64_t>();
  ASSERT_GT(stopped, 0) << out;

  const std::string second = submit(static_cast<int>(stopped) + 10);
  ASSERT_TRUE(wait_for_job(second, 120)) << "job " << second << " still queued or running";
  const std::string out2 = slurp(d / ("job-" + second + ".out"));
  EXPECT_EQ(read_jsonl(fs::path(run) / "events.jsonl").back()["kind"], "run_end") << out2;

  auto r = run_keel("launch --nproc 2 -- train " + source_path("configs/tiny.yaml") + " " +
                    run_args((d / "ref").string(), static_cast<int>(stopped) + 10));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto expected = losses_of(d / "ref"), got = losses_of(run);
  ASSERT_EQ(got.size(), expected.size()) << out2;
  for (const auto& [step, loss] : expected) EXPECT_EQ(got.at(step), loss) << "step " << step;
}

// scripts/slurm/train.sbatch when a device computes wrong every time (a persistent corrupt_grad
// on rank 1): keel exits 4 after a checkpoint, listing the host in exclude_hosts, and the script
// submits the same job again without that host. This cluster has one node, so the new job waits
// (its exclusion is what is checked), and is cancelled.
TEST_F(SlurmCluster, AFaultyDeviceSubmitsTheJobAgainWithoutItsHost) {
  const fs::path d = dir_.path();
  const std::string run = (d / "faulty").string();
  auto r = run_shell(
      "env KEEL=" + std::string(keel::testing::kKeelBinary) +
      " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
      " sbatch --parsable --ntasks=2 --time=5 --output=" + (d / "faulty-%j.out").string() + " " +
      source_path("scripts/slurm/train.sbatch") + " " + source_path("configs/tiny.yaml") + " " +
      run + train_sets(40) +
      " --set 'faults=[{kind: corrupt_grad, at_step: 20, rank: 1, persistent: "
      "true}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string first = r.output.substr(0, r.output.find_first_of(";\n"));
  ASSERT_TRUE(wait_for_job(first, 120)) << "job " << first << " still queued or running";
  const std::string out = slurp(d / ("faulty-" + first + ".out"));
  EXPECT_NE(out.find("a faulty device"), std::string::npos) << out;
  const std::string host = slurp(fs::path(run) / "exclude_hosts");
  ASSERT_FALSE(host.empty()) << out;
  const auto resubmitted = out.find("keel: a faulty device on ");
  ASSERT_NE(resubmitted, std::string::npos) << out;
  const std::string job = out.substr(out.find("job ", resubmitted) + 4);
  const std::string next = job.substr(0, job.find(' '));
  r = run_shell("scontrol show job " + next);
  EXPECT_NE(r.output.find("ExcNodeList=" + host.substr(0, host.find('\n'))), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("NumTasks=2"), std::string::npos) << r.output;
  run_shell("scancel " + next);
  EXPECT_TRUE(std::filesystem::exists(fs::path(run) / "checkpoints/step_00000020")) << out;
}

// scripts/slurm/prepare.sbatch as the docs run it: a job array of 3 tasks, each preparing its part
// of the fortunes, and a merge job that waits for the array (--dependency=afterok): the dataset
// one `keel prepare` over the same files writes.
TEST_F(SlurmCluster, APrepareArrayAndItsMergeWriteTheDatasetOfOneRun) {
  const std::string fortunes = "/usr/share/games/fortunes";
  if (!fs::exists(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  const fs::path d = dir_.path();
  const std::string script = source_path("scripts/slurm/prepare.sbatch");
  const std::string flags = " --separator % --seq-len 256 --val-fraction 0.05";
  const std::string env = "env KEEL=" + std::string(keel::testing::kKeelBinary) + " ";
  auto r = run_shell(env + "sbatch --parsable --array=0-2 --cpus-per-task=1 --output=" +
                     (d / "prepare-%A_%a.out").string() + " " + script + " " +
                     (d / "parts").string() + " --input " + fortunes + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string array = r.output.substr(0, r.output.find_first_of(";\n"));
  r = run_shell(env + "sbatch --parsable --dependency=afterok:" + array +
                " --output=" + (d / "merge-%j.out").string() + " " + script + " --merge " +
                (d / "parts").string() + " --output " + (d / "merged").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string merge = r.output.substr(0, r.output.find_first_of(";\n"));
  ASSERT_TRUE(wait_for_job(merge, 180)) << "job " << merge << " still queued or running";
  std::string logs;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".out") logs += slurp(e.path());
  ASSERT_TRUE(fs::exists(d / "merged/meta.json")) << logs;
  for (int task = 0; task < 3; ++task)
    EXPECT_TRUE(fs::exists(d / "parts" / ("part-0000" + std::to_string(task) + "-of-00003")))
        << logs;

  r = run_keel("prepare --input " + fortunes + " --output " + (d / "one").string() + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(expect_same_dataset(d / "one", d / "merged"), 4u);

  // A task run again alone, as the script's header says (`sbatch --array=1` plus --overwrite): an
  // array of one, which must still write part 1 of 3 (it once wrote the whole corpus as part 0 of
  // 1), so that the merge takes the parts again.
  r = run_shell(env + "sbatch --parsable --array=1 --cpus-per-task=1 --output=" +
                (d / "rerun-%A_%a.out").string() + " " + script + " " + (d / "parts").string() +
                " --input " + fortunes + flags + " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string rerun = r.output.substr(0, r.output.find_first_of(";\n"));
  ASSERT_TRUE(wait_for_job(rerun, 180)) << "job " << rerun << " still queued or running";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d / "parts")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"part-00000-of-00003", "part-00001-of-00003",
                                             "part-00002-of-00003"}));
  r = run_keel("prepare --merge " + (d / "parts").string() + " --output " +
               (d / "merged_again").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(expect_same_dataset(d / "one", d / "merged_again"), 4u);
}

}  // namespace
}  // namespace keel::testing
