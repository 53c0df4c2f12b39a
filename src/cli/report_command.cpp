// keel report RUN_DIR [-o FILE.html]: one self-contained HTML page of a run (src/report/), for a
// finished, a running or a crashed run alike. Exit 0 with the page written, 2 when RUN_DIR is not
// a run directory or the page cannot be written.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "common/error.h"
#include "report/report.h"

namespace keel::cli {

namespace fs = std::filesystem;

namespace {

// Written next to its final name, then renamed: a browser that has the old page open, or a
// report run every few minutes from cron, never reads half a page.
void write_page(const fs::path& path, const std::string& html) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << html;
    out.flush();
    if (!out)
      throw UserError("cannot write " + tmp.string() + ": " + std::strerror(errno) +
                      "\nHINT: -o FILE.html writes the page elsewhere");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw UserError("cannot write " + path.string() + ": " + ec.message());
}

}  // namespace

void register_report(CLI::App& app, int& exit_code) {
  auto run_dir = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  auto* sub = app.add_subcommand(
      "report", "one self-contained HTML page of a run: curves, guard events, incidents, config");
  sub->add_option("RUN_DIR", *run_dir,
                  "the run directory keel train wrote (running, finished or crashed)")
      ->required();
  sub->add_option("-o,--output", *output, "where to write the page (default RUN_DIR/report.html)");
  sub->footer(
      "The page needs no network and no script: open it in any browser, or mail it.\n"
      "\n"
      "Examples:\n"
      "  keel report runs/tiny                 # writes runs/tiny/report.html\n"
      "  keel report runs/tiny -o tiny-report.html");
  sub->callback([run_dir, output, &exit_code] {
    const report::RunRecord run = report::load_run(*run_dir);
    const fs::path path = output->empty() ? fs::path(*run_dir) / "report.html" : fs::path(*output);
    write_page(path, report::render_html(run));
    std::cout << path.string() << "\n";
    if (!run.notes.empty())
      std::cerr << "report: " << run.notes.size() << " note" << (run.notes.size() == 1 ? "" : "s")
                << " on what could not be read (listed at the end of the page)\n";
    exit_code = kExitOk;
  });
}

}  // namespace keel::cli
