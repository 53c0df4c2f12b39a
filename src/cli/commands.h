// One function per subcommand; main.cpp registers them with CLI11 and maps errors to exit codes.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace keel::cli {

// Where the config comes from: a file, or (when path is empty) the embedded configs/tiny.yaml.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;  // --set key.path=value
};

void register_validate(CLI::App& app, int& exit_code);
void register_train(CLI::App& app, int& exit_code);
void register_prepare(CLI::App& app, int& exit_code);
void register_inspect(CLI::App& app, int& exit_code);
void register_launch(CLI::App& app, int& exit_code);
void register_report(CLI::App& app, int& exit_code);
void register_sample(CLI::App& app, int& exit_code);
void register_export(CLI::App& app, int& exit_code);

// `keel launch --nproc 2 train CONFIG --set k=v`: without `--`, the options of the command each
// rank runs reach launch's own parser. UserError naming them, with the user's line and `--` in
// its place; nothing for any other command line. Called before parsing.
void check_launch_separator(int argc, const char* const* argv);

// Shared by the subcommands: the embedded default config's text and display name.
const std::string& embedded_default_config();
inline constexpr const char* kEmbeddedConfigName = "<embedded>/configs/tiny.yaml";

}  // namespace keel::cli
