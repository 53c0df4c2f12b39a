// Where a process sits in a job, from torchrun's, Slurm's or `keel launch`'s variables.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/error.h"
#include "distributed/process_group.h"

namespace keel::distributed {
namespace {

LaunchEnv from(const std::map<std::string, std::string>& vars) {
  return launch_env_from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv e = from({});
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.launcher, "none");
}

TEST(LaunchEnv, ReadsTorchrunsVariablesAndItsAgentStore) {
  const LaunchEnv e = from({{"RANK", "3"},
                            {"LOCAL_RANK", "1"},
                            {"WORLD_SIZE", "4"},
                            {"LOCAL_WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "10.0.0.7"},
                            {"MASTER_PORT", "29511"},
                            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                            {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 29511);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.restart_count, 2);
}

TEST(LaunchEnv, ReadsSlurmsVariablesAndTheFirstHost) {
  const LaunchEnv e = from({{"SLURM_PROCID", "5"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NTASKS", "8"},
                            {"SLURM_NTASKS_PER_NODE", "4"},
                            {"SLURM_JOB_NODELIST", "gpu[003-004,007],cpu01"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.master_addr, "gpu003");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_FALSE(e.agent_store);
  EXPECT_EQ(first_slurm_host("node17"), "node17");
  EXPECT_EQ(first_slurm_host("a01,b[1-2]"), "a01");
  EXPECT_EQ(first_slurm_host("b[12,14]"), "b12");
}

// The ranks on this host, where srun gives no SLURM_NTASKS_PER_NODE (`srun -N 2 -n 5`): this
// node's count in the step's tasks-per-node list; the step's list wins over the job's.
TEST(LaunchEnv, SlurmsRanksOnThisHostComeFromItsTasksPerNodeList) {
  const LaunchEnv e = from({{"SLURM_PROCID", "4"},
                            {"SLURM_NTASKS", "5"},
                            {"SLURM_NODEID", "1"},
                            {"SLURM_TASKS_PER_NODE", "4,4"},
                            {"SLURM_STEP_TASKS_PER_NODE", "3,2"},
                            {"SLURM_JOB_NODELIST", "n[1-2]"}});
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("2(x", 0), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("two", 0), std::nullopt);
}

// A missing or malformed variable is the user's mistake, named.
TEST(LaunchEnv, MissingOrMalformedVariablesNameThemselves) {
  auto message = [](const std::map<std::string, std::string>& vars) {
    try {
      from(vars);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}}).find("MASTER_PORT"),
            std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "2"}}).find("RANK"), std::string::npos);
  EXPECT_NE(message({{"RANK", "two"}, {"WORLD_SIZE", "2"}}).find("RANK=two"), std::string::npos);
  EXPECT_NE(
      message({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}})
          .find("rank 2 of world size 2"),
      std::string::npos);
}

}  // namespace
}  // namespace keel::distributed
