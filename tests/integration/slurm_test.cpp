// keel under a real Slurm: a one-node cluster (slurmctld, slurmd and munged from Debian's
// slurm-wlm and munge, which scripts/setup.sh installs) started on this machine for the test, with
// 2 CPUs, on loopback, and stopped after it. `srun -n 2 keel train` trains as `keel launch --nproc
// 2` does; a job that reaches its time limit under scripts/slurm/train.sbatch (--signal) writes a
// checkpoint and exits, and the same script submitted again continues bit-exactly. The test skips,
// saying why, where the daemons cannot start.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/host_name.h"
#include "harness.h"
#include "slurm_daemons.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

// This machine's short name: the Slurm node's.
std::string short_host_name() {
  const std::string name = keel::host_name("localhost");
  return name.substr(0, name.find('.'));
}

class SlurmCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    // This machine on loopback, and a second node that is down (nothing listens at its port): a
    // job that leaves this host out can still be submitted, and waits.
    const std::string why_not = slurm_.start(
        {{short_host_name(), "127.0.0.1"}, {"keelspare", "127.0.0.1", free_port(), true}}, 2,
        [](int, const std::string& command) { return command; });
    if (!why_not.empty()) GTEST_SKIP() << why_not;
  }

  bool wait_for_job(const std::string& id, int seconds) { return slurm_.wait_for_job(id, seconds); }

  ScratchDir dir_{"slurm_cluster"};
  SlurmDaemons slurm_{dir_.path() / "cluster"};
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

TEST_F(SlurmCluster, SrunTrainsAsKeelLaunchDoes) {
  const fs::path d = dir_.path();
  const std::string port = std::to_string(free_port());
  auto r = run_shell("env MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " srun -n 2 " +
                     keel::testing::kKeelBinary + " train " + run_args((d / "srun").string(), 20));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 of 2 (0 from slurm)"), std::string::npos) << r.output;
  r = run_keel("launch --nproc 2 -- train " + run_args((d / "launch").string(), 20));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = losses_by_step(d / "srun"), b = losses_by_step(d / "launch");
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
    return job_id(r.output);
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
  const auto expected = losses_by_step(d / "ref"), got = losses_by_step(run);
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
  const std::string first = job_id(r.output);
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
  // Its log goes where this job's went (--output=DIR/faulty-%j.out).
  EXPECT_NE(r.output.find("StdOut=" + (d / ("faulty-" + next + ".out")).string()),
            std::string::npos)
      << r.output;
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
  const std::string array = job_id(r.output);
  r = run_shell(env + "sbatch --parsable --dependency=afterok:" + array +
                " --output=" + (d / "merge-%j.out").string() + " " + script + " --merge " +
                (d / "parts").string() + " --output " + (d / "merged").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string merge = job_id(r.output);
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
  const std::string rerun = job_id(r.output);
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
