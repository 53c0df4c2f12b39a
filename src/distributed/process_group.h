// Many ranks over c10d: where this process sits in a job (from torchrun's, Slurm's or `keel
// launch`'s environment) and a Communicator over c10d's process groups — Gloo on the CPU, NCCL on
// CUDA — with rendezvous through c10d's TCPStore. Never a home-made transport.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/schema.h"
#include "distributed/communicator.h"

namespace keel::distributed {

struct LaunchEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's elastic agent already hosts the TCPStore on MASTER_PORT: every rank connects as a
  // client, under the agent's prefix /worker/attempt_<restart_count>, as torch's own rendezvous.
  bool agent_store = false;
  int restart_count = 0;
  std::string launcher = "none";  // torchrun | slurm | none
};

// Reads the launcher's variables through `getenv`: torchrun's (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
// TORCHELASTIC_RESTART_COUNT; `keel launch` sets the same), else Slurm's (SLURM_PROCID,
// SLURM_LOCALID, SLURM_NTASKS, this node's count in SLURM_STEP_TASKS_PER_NODE or
// SLURM_TASKS_PER_NODE (by SLURM_NODEID; srun -N 2 -n 4 sets no SLURM_NTASKS_PER_NODE), the first
// host of SLURM_JOB_NODELIST or SLURM_NODELIST, MASTER_PORT or 29500), else one process. A missing
// or malformed variable is a UserError naming it.
LaunchEnv launch_env_from(const std::function<const char*(const char*)>& getenv);
LaunchEnv launch_env();

// The first host of a Slurm node list: "gpu[003-005,007],cpu01" -> "gpu003".
std::string first_slurm_host(const std::string& nodelist);

// The tasks on node `node` of a Slurm tasks-per-node list ("2(x3),1": 2 on nodes 0-2, 1 on node
// 3); nullopt where the list is malformed or shorter.
std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node);

// A Communicator over a c10d process group for `env` (world_size > 1): backend auto picks NCCL on
// CUDA devices and Gloo otherwise. Every collective waits at most distributed.timeout_s; a rank
// that died makes the others fail with DistError instead of hanging.
std::unique_ptr<Communicator> make_process_group(const LaunchEnv& env,
                                                 const config::DistributedConfig& cfg,
                                                 const torch::Device& device);

}  // namespace keel::distributed
