// keel's command line. Every error surfaces here and becomes an exit code:
// 0 success, 2 the user's input is wrong, 3 the run stopped itself on purpose, 4 it stopped because
// a device computes wrong (this node, not the run), anything else a bug.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdlib>
#include <iostream>

#include "cli/commands.h"
#include "cli/flag_hints.h"
#include "common/error.h"

namespace {

// A process that has decided how it ends leaves with that code when it is told to stop while it
// exits (srun --kill-on-bad-exit and `keel launch` stop the other ranks once one has ended): the
// code says why the job stopped, and a scheduler acts on it (scripts/slurm/train.sbatch requeues
// a job whose ranks exit 4, a faulty device). Without this, SIGTERM during the teardown that
// follows main's return ends it as 143.
volatile std::sig_atomic_t g_decided_code = 0;

void exit_with_decided_code(int) { std::_Exit(g_decided_code); }

int ending(int code) {
  g_decided_code = code;
  std::signal(SIGTERM, exit_with_decided_code);
  std::signal(SIGINT, exit_with_decided_code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"keel: a stability-first trainer for transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", KEEL_VERSION);
  int exit_code = 0;
  keel::cli::register_validate(app, exit_code);
  keel::cli::register_train(app, exit_code);
  keel::cli::register_prepare(app, exit_code);
  keel::cli::register_inspect(app, exit_code);
  keel::cli::register_launch(app, exit_code);
  keel::cli::register_report(app, exit_code);
  keel::cli::register_sample(app, exit_code);
  keel::cli::register_export(app, exit_code);
  try {
    keel::cli::check_launch_separator(argc, argv);
    app.parse(argc, argv);
    return ending(exit_code);
  } catch (const CLI::ExtrasError& e) {
    app.exit(e);
    std::cerr << keel::cli::flag_hints(app);
    return ending(keel::kExitUserError);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : keel::kExitUserError;
  } catch (const keel::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return ending(keel::kExitUserError);
  } catch (const keel::Interrupted& e) {
    std::cerr << e.what() << "; a checkpoint was written, resume with --resume latest\n";
    return ending(e.exit_code());
  } catch (const keel::DistError& e) {
    std::cerr << "stopped: " << e.what() << "\n";
    return ending(keel::kExitRunStopped);
  } catch (const keel::FaultyDevice& e) {
    std::cerr << "stopped: " << e.what() << "\n";
    return ending(keel::kExitFaultyDevice);
  } catch (const keel::RunStopped& e) {
    std::cerr << "stopped: " << e.what() << "\n";
    return ending(keel::kExitRunStopped);
  } catch (const std::exception& e) {
    std::cerr << "internal error (a bug in keel, please report it): " << e.what() << "\n";
    return ending(keel::kExitBug);
  }
}
