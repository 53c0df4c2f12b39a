// A Slurm cluster for the tests: munged, slurmctld and one slurmd per node, from Debian's slurm-wlm
// and munge (scripts/setup.sh installs them), started in a scratch directory and stopped by the
// destructor. The nodes are this machine on loopback (slurm_test.cpp) or test hosts, one slurmd on
// each (slurm_hosts_test.cpp). Clients (srun, sbatch, squeue) find it through SLURM_CONF, which
// start() sets.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace keel::testing {

inline int free_port() {
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

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The first line of `sbatch --parsable`'s output: the job id.
inline std::string job_id(const std::string& parsable) {
  return parsable.substr(0, parsable.find_first_of(";\n"));
}

struct SlurmNode {
  std::string name;
  std::string address;
  int port = 0;       // 0: the cluster's SlurmdPort
  bool down = false;  // configured, but no slurmd is started for it
};

class SlurmDaemons {
 public:
  // How a daemon or client command reaches node i's host: the command line to run instead.
  using On = std::function<std::string(int node, const std::string& command)>;

  explicit SlurmDaemons(const std::filesystem::path& dir) : dir_(dir) {}
  ~SlurmDaemons() { stop(); }
  SlurmDaemons(const SlurmDaemons&) = delete;
  SlurmDaemons& operator=(const SlurmDaemons&) = delete;

  // Starts the cluster: slurmctld on node 0's host, a slurmd for each node that is not down, each
  // with `cpus` CPUs, one partition `keel` of every node. Empty when every node up is idle, else
  // why not (the tests skip with it).
  std::string start(const std::vector<SlurmNode>& nodes, int cpus, On on) {
    on_ = std::move(on);
    for (const char* program : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                                "/usr/bin/srun", "/usr/bin/sbatch"})
      if (!std::filesystem::exists(program))
        return std::string(program) + " is missing: scripts/setup.sh installs slurm-wlm and munge";
    if (::geteuid() != 0) return "slurmd runs jobs as their user only as root here";
    for (const char* sub : {"spool", "state", "log", "run"})
      std::filesystem::create_directories(dir_ / sub);
    {
      std::ofstream key(dir_ / "munge.key", std::ios::binary);
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>((i * 7919 + ::getpid()) & 0xff));
    }
    std::filesystem::permissions(dir_ / "munge.key", std::filesystem::perms::owner_read |
                                                         std::filesystem::perms::owner_write);
    // One munged for every host: its socket is a file, and the hosts share the filesystem.
    const std::string socket = (dir_ / "run/munge.sock").string();
    auto r = run_shell("/usr/sbin/munged -f --socket=" + socket +
                       " --key-file=" + (dir_ / "munge.key").string() +
                       " --log-file=" + (dir_ / "log/munged.log").string() +
                       " --pid-file=" + (dir_ / "run/munged.pid").string() +
                       " --seed-file=" + (dir_ / "run/munged.seed").string());
    if (r.exit_code != 0) return "munged does not start: " + r.output;
    munged_ = true;
    const std::string d = dir_.string();
    std::ofstream conf(dir_ / "slurm.conf");
    conf << "ClusterName=keeltest\nSlurmctldHost=" << nodes[0].name << "(" << nodes[0].address
         << ")\nSlurmctldPort=" << free_port() << "\nSlurmdPort=" << free_port() << "\n"
         << "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
         << "AuthInfo=socket=" << socket << "\nStateSaveLocation=" << d
         << "/state\n"
         // %n: each slurmd its own files, where several share the filesystem.
         << "SlurmdSpoolDir=" << d << "/spool/%n\nSlurmctldPidFile=" << d << "/run/slurmctld.pid\n"
         << "SlurmdPidFile=" << d << "/run/slurmd-%n.pid\nSlurmctldLogFile=" << d
         << "/log/slurmctld.log\nSlurmdLogFile=" << d << "/log/slurmd-%n.log\n"
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
         << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
         << "ReturnToService=2\nKillWait=10\nInactiveLimit=0\nMinJobAge=300\n";
    std::string names;
    for (const auto& n : nodes) {
      conf << "NodeName=" << n.name << " NodeAddr=" << n.address;
      if (n.port != 0) conf << " Port=" << n.port;
      conf << " CPUs=" << cpus << " State=" << (n.down ? "DOWN" : "UNKNOWN") << "\n";
      names += (names.empty() ? "" : ",") + n.name;
    }
    conf << "PartitionName=keel Nodes=" << names
         << " Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
    conf.close();
    conf_ = (dir_ / "slurm.conf").string();
    ::setenv("SLURM_CONF", conf_.c_str(), 1);
    conf_set_ = true;
    r = run_shell(on_(0, "/usr/sbin/slurmctld -f " + conf_ + " -i"));
    if (r.exit_code != 0) return "slurmctld does not start: " + r.output;
    started_ = true;
    int up = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].down) continue;
      ++up;
      slurmd_pid_files_.push_back(dir_ / "run" / ("slurmd-" + nodes[i].name + ".pid"));
      r = run_shell(on_(static_cast<int>(i), "/usr/sbin/slurmd -f " + conf_));
      if (r.exit_code != 0) return "slurmd on " + nodes[i].name + " does not start: " + r.output;
    }
    for (int i = 0; i < 100; ++i) {
      const std::string states = client("sinfo -h -N -o %t").output;
      size_t idle = 0;
      for (size_t at = states.find("idle"); at != std::string::npos;
           at = states.find("idle", at + 1))
        ++idle;
      if (static_cast<int>(idle) == up) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return "the nodes never became idle:\n" + logs();
  }

  // A client command (srun, sbatch, squeue ...) run where node 0 is.
  CommandResult client(const std::string& command) const { return run_shell(on_(0, command)); }

  // Waits until job `id` has left the queue; false after `seconds`.
  bool wait_for_job(const std::string& id, int seconds) const {
    for (int i = 0; i < seconds * 5; ++i) {
      if (client("squeue -h -j " + id).output.find(id) == std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  std::string logs() const {
    std::string out;
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "log"))
      out += "== " + e.path().filename().string() + "\n" + slurp(e.path());
    return out;
  }

  // The jobs cancelled, then every daemon asked to end (SIGTERM), and killed after 5 s.
  void stop() {
    if (started_) client("scancel --full --signal=KILL --partition=keel");
    std::vector<std::filesystem::path> pid_files = slurmd_pid_files_;
    if (started_) pid_files.push_back(dir_ / "run/slurmctld.pid");
    if (munged_) pid_files.push_back(dir_ / "run/munged.pid");
    std::vector<int> pids;
    for (const auto& pid_file : pid_files) {
      std::ifstream in(pid_file);
      if (int pid = 0; in >> pid && pid > 0 && ::kill(pid, SIGTERM) == 0) pids.push_back(pid);
    }
    for (int i = 0; i < 50 && std::any_of(pids.begin(), pids.end(), running); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int pid : pids)
      if (running(pid)) ::kill(pid, SIGKILL);
    if (conf_set_) ::unsetenv("SLURM_CONF");
    started_ = munged_ = conf_set_ = false;
    slurmd_pid_files_.clear();
  }

 private:
  // Alive and not a zombie (a daemon's parent here may never reap it).
  static bool running(int pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const auto state = line.find(") ");
    return state != std::string::npos && state + 2 < line.size() && line[state + 2] != 'Z';
  }

  std::filesystem::path dir_;
  On on_ = [](int, const std::string& command) { return command; };
  std::string conf_;
  std::vector<std::filesystem::path> slurmd_pid_files_;
  bool munged_ = false;
  bool started_ = false;
  bool conf_set_ = false;
};

}  // namespace keel::testing
