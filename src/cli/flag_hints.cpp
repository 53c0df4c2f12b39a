#include "cli/flag_hints.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/spelling.h"
#include "config/load.h"

namespace keel::cli {
namespace {

// The config keys whose last part is `name` (with '-' read as '_'), or the one closest to it.
std::vector<std::string> keys_named(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  std::vector<std::string> out, leaves;
  const std::vector<std::string> keys = config::all_key_paths();
  for (const auto& key : keys) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    if (leaf == name) out.push_back(key);
    leaves.push_back(leaf);
  }
  if (out.empty())
    if (auto near = closest_word(name, leaves))
      for (const auto& key : keys)
        if (key.substr(key.rfind('.') + 1) == *near) out.push_back(key);
  return out;
}

std::string hint_for(const CLI::App& command, const std::string& arg, const std::string& value) {
  const std::string name = arg.substr(arg.find_first_not_of('-'));
  std::vector<std::string> flags;
  for (const CLI::Option* opt : command.get_options())
    for (const auto& long_name : opt->get_lnames()) flags.push_back(long_name);
  if (auto near = closest_word(name, flags))
    return fmt::format("HINT: {}: did you mean --{}? (`keel {} --help` lists its flags)", arg,
                       *near, command.get_name());
  const std::vector<std::string> keys = keys_named(name);
  if (keys.empty() || keys.size() > 3) return "";
  std::string sets;
  for (const auto& key : keys)
    sets += fmt::format("{}--set {}={}", sets.empty() ? "" : " or ", key,
                        value.empty() ? "VALUE" : value);
  return fmt::format("HINT: {}: config keys are set with --set: {}", arg, sets);
}

}  // namespace

std::string flag_hints(const CLI::App& app) {
  const CLI::App* command = &app;
  for (const CLI::App* sub : app.get_subcommands()) command = sub;
  const std::vector<std::string> extras = command->remaining();
  std::string out;
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& arg = extras[i];
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) continue;
    const bool has_value = i + 1 < extras.size() && extras[i + 1].rfind("-", 0) != 0;
    const std::string hint =
        hint_for(*command, arg.substr(0, arg.find('=')),
                 arg.find('=') != std::string::npos ? arg.substr(arg.find('=') + 1)
                                                    : (has_value ? extras[i + 1] : std::string()));
    if (!hint.empty()) out += hint + "\n";
  }
  return out;
}

}  // namespace keel::cli
