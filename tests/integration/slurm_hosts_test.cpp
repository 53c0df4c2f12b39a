// keel under a Slurm cluster of several hosts (issue 50): test hosts (test_hosts.h) with a slurmd
// each and slurmctld on the first (slurm_daemons.h). srun across two hosts trains as four ranks on
// one host do, bit for bit, with the rendezvous on the job's first node by name; a host with a
// faulty device is left out by scripts/slurm/train.sbatch, whose job goes on on a spare host and
// ends as a run that never met the fault. The tests skip, saying why, where namespaces or the
// daemons cannot be made.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "harness.h"
#include "slurm_daemons.h"
#include "test_hosts.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

// A cluster of `count` test hosts keelh0 ... with 2 CPUs each, slurmctld on keelh0.
class SlurmHosts {
 public:
  explicit SlurmHosts(int count) : hosts_(count), slurm_(dir_.path() / "cluster") {
    if (!hosts_.ok()) {
      why_not_ = "network namespaces cannot be made here (needs root, iproute2 and util-linux): " +
                 hosts_.why_not();
      return;
    }
    std::vector<SlurmNode> nodes;
    for (int h = 0; h < count; ++h) nodes.push_back({hosts_.hostname(h), hosts_.address(h)});
    why_not_ = slurm_.start(nodes, 2, [this](int node, const std::string& command) {
      return hosts_.on(node, command);
    });
  }
  const std::string& why_not() const { return why_not_; }
  const TestHosts& hosts() const { return hosts_; }
  SlurmDaemons& slurm() { return slurm_; }
  const fs::path& dir() const { return dir_.path(); }

 private:
  ScratchDir dir_{"slurm_hosts"};
  TestHosts hosts_;
  SlurmDaemons slurm_;
  std::string why_not_;
};

#define REQUIRE_CLUSTER(cluster) \
  if (!(cluster).why_not().empty()) GTEST_SKIP() << (cluster).why_not()

// The embedded config, every step logged, a constant lr (a run's length changes no step's lr).
std::string train_sets(int steps) {
  return kQuickRun + " --set data.micro_batch_size=4 --set schedule.kind=constant" +
         " --set run.max_steps=" + std::to_string(steps);
}

// The same run as `ranks` ranks on this machine (keel launch), its losses.
std::map<int64_t, double> losses_on_one_host(const fs::path& run_dir, int ranks, int steps) {
  const auto r = run_keel("launch --nproc " + std::to_string(ranks) + " -- train --run-dir " +
                          run_dir.string() + train_sets(steps) + " --set checkpoint.every_steps=0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return losses_by_step(run_dir);
}

// `srun -N 2 -n 4` from the first host: two ranks on each, the rendezvous on the job's first node
// (keelh0, from SLURM_JOB_NODELIST, resolved by the hosts' /etc/hosts), each host's two ranks
// counting themselves its local ranks (SLURM_STEP_TASKS_PER_NODE; srun sets no
// SLURM_NTASKS_PER_NODE here). The losses are those of four ranks on one host, to the bit.
TEST(SlurmHosts, SrunAcrossTwoHostsTrainsAsOneHostOfFour) {
  SlurmHosts cluster(2);
  REQUIRE_CLUSTER(cluster);
  const fs::path run = cluster.dir() / "srun";
  const auto r = cluster.slurm().client("srun -N 2 -n 4 --label " + std::string(kKeelBinary) +
                                        " train --run-dir " + run.string() + train_sets(12) +
                                        " --set checkpoint.every_steps=0");
  ASSERT_EQ(r.exit_code, 0) << r.output << cluster.slurm().logs();
  EXPECT_NE(r.output.find("rank 0 of 4 (0 from slurm), gloo over keelh0:29500, on host keelh0 (" +
                          cluster.hosts().address(0) + ")"),
            std::string::npos)
      << r.output;
  const auto across = losses_by_step(run);
  ASSERT_EQ(across.size(), 12u) << r.output;
  EXPECT_EQ(across, losses_on_one_host(cluster.dir() / "one", 4, 12));
}

// A device on keelh0 computes wrong every time (faults[].host: the fault stays with the host, as a
// broken GPU does, whatever rank runs there). The job of two nodes (keelh0, keelh1) stops with
// exit 4 after saving the last good step and naming keelh0; scripts/slurm/train.sbatch submits it
// again without keelh0, Slurm places it on keelh1 and the spare keelh2, and it meets on its own
// first node (not the left-out host, the first job's), resumes and finishes: every loss is that of
// an undisturbed two-rank run. The new job's log is where the first one's went (--output).
TEST(SlurmHosts, AFaultyHostIsLeftOutAndTheJobFinishesOnASpare) {
  SlurmHosts cluster(3);
  REQUIRE_CLUSTER(cluster);
  const fs::path d = cluster.dir();
  const fs::path run = d / "faulty";
  const int steps = 40;
  auto r = cluster.slurm().client(
      "env KEEL=" + std::string(kKeelBinary) +
      " sbatch --parsable --nodes=2 --ntasks-per-node=1 --nodelist=keelh0,keelh1 --time=5"
      " --output=" +
      (d / "job-%j.out").string() + " " + source_path("scripts/slurm/train.sbatch") + " " +
      source_path("configs/tiny.yaml") + " " + run.string() + train_sets(steps) +
      " --set checkpoint.every_steps=1000 --set 'faults=[{kind: corrupt_grad, at_step: 20, "
      "host: keelh0, persistent: true}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string first = job_id(r.output);
  ASSERT_TRUE(cluster.slurm().wait_for_job(first, 120)) << "job " << first << " still queued\n"
                                                        << cluster.slurm().logs();
  const std::string out = slurp(d / ("job-" + first + ".out"));
  EXPECT_EQ(slurp(run / "exclude_hosts"), "keelh0\n") << out;
  const auto said = out.find("keel: a faulty device on keelh0; job ");
  ASSERT_NE(said, std::string::npos) << out << cluster.slurm().logs();
  const std::string rest =
      out.substr(said + std::string("keel: a faulty device on keelh0; job ").size());
  const std::string second = rest.substr(0, rest.find(' '));
  ASSERT_TRUE(cluster.slurm().wait_for_job(second, 180)) << "job " << second << " still queued\n"
                                                         << cluster.slurm().logs();
  const std::string out2 = slurp(d / ("job-" + second + ".out"));
  r = cluster.slurm().client("scontrol show job " + second);
  EXPECT_NE(r.output.find(" NodeList=keelh[1-2]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ExitCode=0:0"), std::string::npos)
      << r.output << out2 << cluster.slurm().logs();
  const auto events = read_jsonl(run / "events.jsonl");
  ASSERT_FALSE(events.empty()) << out2;
  EXPECT_EQ(events.back()["kind"], "run_end") << out2;
  EXPECT_NE(out2.find("resumed from " + (run / "checkpoints").string()), std::string::npos) << out2;
  EXPECT_NE(out2.find("gloo over keelh1:"), std::string::npos) << out2;
  EXPECT_EQ(losses_by_step(run), losses_on_one_host(d / "clean", 2, steps)) << out << out2;
}

}  // namespace
}  // namespace keel::testing
