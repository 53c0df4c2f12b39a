// What a mistyped flag most likely meant: the command's own flag (`prepare --inputs` is
// `--input`), or a config key, which is set with --set (`train --max-steps 20` is
// `--set run.max_steps=20`). CLI11 says only that the arguments were not expected.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace keel::cli {

// One "HINT: ..." line per unexpected flag of the parse `app` just refused, or "" when none
// resembles anything.
std::string flag_hints(const CLI::App& app);

}  // namespace keel::cli
