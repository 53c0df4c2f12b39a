// Hosts on this machine for the tests that run one job across machines (issue 50). Each host is a
// network namespace with an address of its own (10.231.<pid % 250>.<h + 1>), all joined by a
// bridge in one more namespace (the switch), and, for each command run on it, a hostname of its
// own (keelh<h>, a UTS namespace) and an /etc/hosts that names every test host (bound over the
// file in a private mount namespace): what a cluster's nodes have. The test makes and removes them
// and uses no other address. The filesystem is shared, as a cluster's is. Where namespaces
// cannot be made (no root, no iproute2 or util-linux), ok() is false and why_not() says why.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"

namespace keel::testing {

// `s` as one word for sh: in single quotes, each ' written as '\''.
inline std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class TestHosts {
 public:
  explicit TestHosts(int count = 2) : dir_("test_hosts") {
    const std::string id = std::to_string(::getpid());
    const std::string subnet = "10.231." + std::to_string(::getpid() % 250) + ".";
    switch_ = "keel_s" + id;
    std::string script = "set -e; ip netns add " + switch_ + "; ip -n " + switch_ +
                         " link add br0 type bridge; ip -n " + switch_ + " link set br0 up; ";
    std::ofstream hosts_file(dir_.path() / "hosts");
    hosts_file << "127.0.0.1 localhost\n";
    for (int h = 0; h < count; ++h) {
      const std::string n = std::to_string(h);
      names_.push_back("keel_h" + id + "_" + n);
      links_.push_back("kh" + id + "_" + n);
      addresses_.push_back(subnet + std::to_string(h + 1));
      hostnames_.push_back("keelh" + n);
      hosts_file << addresses_[h] << " " << hostnames_[h] << "\n";
      const std::string& ns = names_[h];
      const std::string port = "ks" + id + "_" + n;  // the link's end in the switch
      // Made inside the namespaces: nothing is left in this machine's own if a step fails.
      script += "ip netns add " + ns + "; ip -n " + ns + " link add " + links_[h] +
                " type veth peer name " + port + " netns " + switch_ + "; ip -n " + switch_ +
                " link set " + port + " master br0 up; ip -n " + ns + " addr add " + addresses_[h] +
                "/24 dev " + links_[h] + "; ip -n " + ns + " link set " + links_[h] +
                " up; ip -n " + ns + " link set lo up; ";
    }
    hosts_file.close();
    // Entering a host: its name, its /etc/hosts, then the command.
    enter_ = dir_.path() / "enter";
    std::ofstream(enter_) << "#!/bin/sh\nhostname \"$1\" && mount --bind "
                          << shell_quoted((dir_.path() / "hosts").string())
                          << " /etc/hosts && shift && exec \"$@\"\n";
    std::filesystem::permissions(enter_, std::filesystem::perms::owner_all);
    const auto r =
        run_shell("command -v nsenter unshare ip > /dev/null && bash -c " + shell_quoted(script));
    ok_ = r.exit_code == 0;
    if (!ok_) why_not_ = r.output.empty() ? "nsenter, unshare or ip is missing" : r.output;
  }
  ~TestHosts() {
    // A host's processes (a daemon) end first; its link goes with its namespace.
    for (const auto& n : names_) run_shell("ip netns pids " + n + " | xargs -r kill -9");
    for (const auto& n : names_) run_shell("ip netns del " + n);
    run_shell("ip netns del " + switch_);
  }
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;

  bool ok() const { return ok_; }
  const std::string& why_not() const { return why_not_; }
  int count() const { return static_cast<int>(names_.size()); }
  const std::string& address(int h) const { return addresses_[h]; }
  const std::string& hostname(int h) const { return hostnames_[h]; }
  // A shell command that runs `command` (a shell command line) on host h. nsenter, not `ip netns
  // exec`: that one mounts a new /sys, without the cgroup filesystem slurmd needs.
  std::string on(int h, const std::string& command) const {
    return "nsenter --net=/run/netns/" + names_[h] + " unshare --uts --mount " +
           shell_quoted(enter_.string()) + " " + hostnames_[h] + " sh -c " + shell_quoted(command);
  }
  void link_down(int h) const {
    run_shell("ip -n " + names_[h] + " link set " + links_[h] + " down");
  }

 private:
  ScratchDir dir_;
  std::filesystem::path enter_;
  std::string switch_;
  std::vector<std::string> names_, links_, addresses_, hostnames_;
  bool ok_ = false;
  std::string why_not_;
};

#define REQUIRE_HOSTS(hosts)                                                          \
  if (!(hosts).ok())                                                                  \
  GTEST_SKIP() << "network namespaces cannot be made here (needs root, iproute2 and " \
                  "util-linux): "                                                     \
               << (hosts).why_not()

}  // namespace keel::testing
