// `keel launch --nproc N -- train CONFIG ...`: N local ranks of this same binary, with the
// environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT), each rank's output line by line with a
// "[rank R] " prefix. With `--nnodes M --node-rank K --master-addr A --master-port P` on each of
// M hosts, the job spans them as torchrun's static rendezvous does: host K runs ranks K*N to
// K*N+N-1, and rank 0's host, A, hosts the store.
// SIGTERM/SIGINT go to every rank (each checkpoints and exits); when a rank fails, the others are
// told to stop (SIGTERM, then SIGKILL after a grace period) and the launcher exits with the first
// failure's code, naming that rank. A launcher that dies without a word (SIGKILL) takes its ranks
// with it: each gets SIGTERM from the kernel (PR_SET_PDEATHSIG).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"

namespace keel::cli {
namespace {

// keel's exit code for a collective that failed (DistError): usually a peer died first.
constexpr int kPeerFailedExit = 3;

std::atomic<int> g_forward_signal{0};
void on_signal(int sig) { g_forward_signal.store(sig); }

// A port the kernel says is free on loopback now (the rendezvous binds it a moment later).
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw UserError(std::string("keel launch: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw UserError(std::string("keel launch: no free port on 127.0.0.1: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Where this host's ranks sit in the job.
struct Layout {
  int nproc = 2;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int port = 0;
};

struct Rank {
  pid_t pid = -1;
  int out = -1;         // read end of its stdout+stderr
  std::string partial;  // an unfinished line
  std::optional<int> exit_code;
};

void flush_lines(Rank& r, int rank, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = r.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    std::cout << "[rank " << rank << "] " << r.partial.substr(start, nl - start + 1);
  r.partial.erase(0, start);
  if (all && !r.partial.empty()) {
    std::cout << "[rank " << rank << "] " << r.partial << "\n";
    r.partial.clear();
  }
  std::cout.flush();
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Starts rank `r` of `nproc`: this binary with `args` and torchrun's environment, its stdout and
// stderr into a pipe whose read end the returned Rank holds.
Rank start_rank(int local, const Layout& layout, const std::string& threads,
                const std::vector<std::string>& args) {
  const int r = layout.node_rank * layout.nproc + local;
  int fds[2];
  if (::pipe(fds) != 0) throw UserError(std::string("keel launch: pipe: ") + std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw UserError(std::string("keel launch: fork: ") + std::strerror(errno));
  if (pid == 0) {
    // A rank dies with its launcher (SIGKILL, the OOM killer): SIGTERM from the kernel, instead
    // of training on as an orphan until a collective times out. It ends at once, or at the next
    // line it logs (its output pipe has no reader left: SIGPIPE); a checkpoint is not promised.
    // The setting survives exec.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(128 + SIGTERM);  // it died before prctl took effect
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(layout.nnodes * layout.nproc).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(layout.nproc).c_str(), 1);
    ::setenv("GROUP_RANK", std::to_string(layout.node_rank).c_str(), 1);
    ::setenv("MASTER_ADDR", layout.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(layout.port).c_str(), 1);
    ::setenv("KEEL_LAUNCH_PREFIXES_RANKS", "1", 1);   // the log leaves the rank tag to us
    ::setenv("OMP_NUM_THREADS", threads.c_str(), 0);  // as torchrun: the cores shared out
    std::vector<char*> argv;
    std::string self = "/proc/self/exe";
    argv.push_back(self.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::perror("keel launch: exec");
    ::_exit(127);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  Rank rank;
  rank.pid = pid;
  rank.out = fds[0];
  return rank;
}

// Waits up to 100 ms for output and passes every complete line on, prefixed with its rank.
void pump_output(std::vector<Rank>& ranks, int first_rank) {
  std::vector<pollfd> fds;
  std::vector<int> owner;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (ranks[r].out >= 0) {
      fds.push_back({ranks[r].out, POLLIN, 0});
      owner.push_back(r);
    }
  if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Rank& rk = ranks[owner[i]];
    char buf[4096];
    ssize_t n;
    while ((n = ::read(rk.out, buf, sizeof buf)) > 0) rk.partial.append(buf, n);
    flush_lines(rk, first_rank + owner[i], false);
    if (n == 0) {
      flush_lines(rk, first_rank + owner[i], true);
      ::close(rk.out);
      rk.out = -1;
    }
  }
}

// Reaps the ranks that exited; the one that failed first of those (a rank that failed of its own
// accord before one whose collective failed because a peer was gone, exit code 3), if any.
std::optional<int> reap(std::vector<Rank>& ranks) {
  std::optional<int> failed_now;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    if (ranks[r].exit_code) continue;
    int status = 0;
    if (::waitpid(ranks[r].pid, &status, WNOHANG) != ranks[r].pid) continue;
    ranks[r].exit_code = exit_code_of(status);
    if (*ranks[r].exit_code != 0 &&
        (!failed_now || (*ranks[*failed_now].exit_code == kPeerFailedExit &&
                         *ranks[r].exit_code != kPeerFailedExit)))
      failed_now = r;
  }
  return failed_now;
}

// Several hosts need one address and port that every host reaches and none can pick alone.
void check_layout(const Layout& layout) {
  if (layout.node_rank >= layout.nnodes)
    throw UserError("keel launch --node-rank " + std::to_string(layout.node_rank) +
                    ": must be below --nnodes " + std::to_string(layout.nnodes) +
                    " (hosts are numbered from 0)");
  if (layout.nnodes == 1) return;
  if (layout.master_addr == "127.0.0.1" || layout.master_addr == "localhost" ||
      layout.master_addr == "::1")
    throw UserError("keel launch --nnodes " + std::to_string(layout.nnodes) +
                    ": --master-addr must be the address of the host with --node-rank 0 that "
                    "every host reaches (got " +
                    layout.master_addr + ", which each host reads as itself)");
  if (layout.port == 0)
    throw UserError("keel launch --nnodes " + std::to_string(layout.nnodes) +
                    ": give --master-port, the same free port on every host (a free port cannot "
                    "be agreed on without it; torchrun's default is 29500)");
}

int launch(Layout layout, const std::vector<std::string>& args, double grace_s) {
  check_layout(layout);
  if (layout.port == 0) layout.port = free_loopback_port();
  const int nproc = layout.nproc;
  const int first_rank = layout.node_rank * nproc;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc)));
  std::vector<Rank> ranks;
  for (int r = 0; r < nproc; ++r) ranks.push_back(start_rank(r, layout, threads, args));

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::optional<int> first_failed;
  // SIGKILL for the ranks still running at this time (max(): none pending).
  auto kill_at = std::chrono::steady_clock::time_point::max();
  int forwarded = 0;
  auto signal_all = [&](int sig) {
    for (auto& rk : ranks)
      if (!rk.exit_code) ::kill(rk.pid, sig);
  };
  while (true) {
    pump_output(
        ranks,
        first_rank);  // output first, so a rank's last lines come before its exit is reported
    if (const auto failed = reap(ranks); failed && !first_failed && forwarded == 0) {
      first_failed = *failed;
      std::cerr << "keel launch: rank " << first_rank + *failed << " exited with "
                << *ranks[*failed].exit_code << "; stopping the other ranks"
                << (layout.nnodes > 1 ? " of this host" : "") << "\n";
      signal_all(SIGTERM);
      kill_at = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
    }
    if (const int sig = g_forward_signal.exchange(0); sig != 0) {
      forwarded = sig;
      signal_all(sig);  // each rank finishes its step, checkpoints and exits
    }
    if (std::chrono::steady_clock::now() > kill_at) {
      for (int r = 0; r < nproc; ++r)
        if (!ranks[r].exit_code)
          std::cerr << "keel launch: rank " << first_rank + r << " did not stop within " << grace_s
                    << " s of SIGTERM (hung?): killing it\n";
      signal_all(SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    bool done = true;
    for (auto& rk : ranks) done &= rk.exit_code.has_value() && rk.out < 0;
    if (done) break;
  }
  if (first_failed) {
    std::cerr << "keel launch: failed: rank " << first_rank + *first_failed << " exited first with "
              << *ranks[*first_failed].exit_code << "\n";
    return *ranks[*first_failed].exit_code;
  }
  for (int r = 0; r < nproc; ++r)
    if (*ranks[r].exit_code != 0) return *ranks[r].exit_code;  // after a forwarded signal
  return 0;
}

}  // namespace

void check_launch_separator(int argc, const char* const* argv) {
  if (argc < 2 || std::string(argv[1]) != "launch") return;
  std::vector<std::string> args(argv + 2, argv + argc);
  size_t command = args.size();  // the first word that is not launch's own
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return;
    if (a == "--nproc" || a == "--master-port" || a == "--grace" || a == "--nnodes" ||
        a == "--node-rank" || a == "--master-addr") {
      ++i;
      continue;
    }
    if (a.rfind("-", 0) == 0) continue;
    command = i;
    break;
  }
  std::string stray;
  for (size_t i = command; i < args.size(); ++i)
    if (args[i].rfind("-", 0) == 0) {
      stray = args[i];
      break;
    }
  if (stray.empty()) return;  // `keel launch --nproc 2 train CONFIG` parses as it is
  std::string line = "keel launch";
  for (size_t i = 0; i < args.size(); ++i) line += (i == command ? " -- " : " ") + args[i];
  throw UserError("keel launch: " + stray + " belongs to the command each rank runs (" +
                  args[command] + "), not to launch; put `--` before that command\nHINT: " + line);
}

void register_launch(CLI::App& app, int& exit_code) {
  auto layout = std::make_shared<Layout>();
  // Once a rank has failed the others cannot checkpoint together (a checkpoint's barrier needs
  // every rank), so they get a moment to report and exit, not a long wait: a hung rank that
  // ignores SIGTERM is killed two seconds after the first failure.
  auto grace = std::make_shared<double>(2.0);
  auto args = std::make_shared<std::vector<std::string>>();
  auto* sub = app.add_subcommand(
      "launch", "run N local ranks of a keel command over c10d (Gloo on CPU, NCCL on CUDA)");
  sub->add_option("--nproc", layout->nproc, "ranks to start on this host")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--nnodes", layout->nnodes,
                  "hosts the job spans; each runs keel launch with the same options but "
                  "--node-rank")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--node-rank", layout->node_rank,
                  "this host's place, 0 to nnodes-1: it runs ranks node_rank*nproc onwards")
      ->check(CLI::Range(0, 4095))
      ->capture_default_str();
  sub->add_option("--master-addr", layout->master_addr,
                  "address of the host with --node-rank 0, which hosts the rendezvous store "
                  "(with --nnodes above 1: one every host reaches)")
      ->capture_default_str();
  sub->add_option("--master-port", layout->port,
                  "rendezvous port (default on one host: a free one on 127.0.0.1; required "
                  "with --nnodes above 1)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--grace", *grace,
                  "seconds the other ranks get to stop after one fails, before SIGKILL")
      ->capture_default_str();
  sub->add_option("command", *args, "the keel command each rank runs, after --")->required();
  sub->footer(
      "The same job under torchrun: torchrun --no-python --nproc_per_node 2 keel train CONFIG ...\n"
      "Across hosts, on each host K of M: keel launch --nnodes M --node-rank K --master-addr "
      "HOST0 --master-port 29500 --nproc N -- train CONFIG ...\n"
      "\n"
      "Examples:\n"
      "  keel launch --nproc 2 -- train configs/tiny.yaml --set run.max_steps=100\n"
      "  keel launch --nproc 8 -- train configs/gpt2-124m.yaml --run-dir runs/gpt2 --resume "
      "latest");
  sub->callback([layout, grace, args, &exit_code] { exit_code = launch(*layout, *args, *grace); });
}

}  // namespace keel::cli
