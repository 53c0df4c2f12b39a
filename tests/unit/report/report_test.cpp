// keel report reads whatever a run directory holds — a finished run, one still writing its last
// line, one that crashed before its first eval — and writes one page that needs nothing from the
// network. These tests build run directories by hand, file by file, as the trainer writes them.
#include "report/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "report/plots.h"
#include "report/svg.h"
#include "scratch_dir.h"

namespace keel::report {
namespace {

namespace fs = std::filesystem;
using keel::testing::ScratchDir;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size()))
    ++n;
  return n;
}

// A forensic sample whose text would break the page (and run a script) if it were not escaped.
const std::string kHostileText = "<script>alert(\"x\")</script> & caf\xC3\xA9 \xFF end";

// Twelve steps with a rollback: steps 1..8 logged, an alarm at 8 rolls back to the stable snapshot
// at 4, steps 5..12 logged again. eval.jsonl is missing; metrics.jsonl ends mid-line.
void write_incident_run(const fs::path& dir) {
  std::string metrics;
  auto line = [&](int step, double loss, double norm, bool recovery = false) {
    metrics +=
        "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
        ",\"lr\":0.001,\"grad_norm\":" + std::to_string(norm) +
        ",\"grad_norm_median\":0.5,\"tokens_seen\":" + std::to_string(step * 2048) +
        ",\"loader_wait_ms\":0.02,\"queue_depth\":3,\"masked_samples\":" + (step == 6 ? "4" : "0") +
        ",\"skipped_steps\":0,\"grad_norm_layers\":{\"head\":0.1},\"sample_loss\":{\"p50\":" +
        std::to_string(loss) + ",\"max\":" + std::to_string(loss + 1) + "}" +
        (recovery ? ",\"recovery\":true" : "") + "}\n";
  };
  for (int s = 1; s <= 8; ++s) line(s, 5.0 - 0.2 * s, s == 8 ? 9.0 : 0.5);
  for (int s = 5; s <= 12; ++s) line(s, 4.0 - 0.1 * s, 0.45, s <= 7);
  metrics += "{\"step\":13,\"loss\":2.";  // the run is writing this line
  write(dir / "metrics.jsonl", metrics);

  write(dir / "events.jsonl",
        "{\"step\":0,\"kind\":\"run_start\",\"iteration\":0,\"detail\":{\"device\":\"cpu\","
        "\"parameters\":459392,\"world_size\":1}}\n"
        "{\"step\":3,\"kind\":\"skip_nan\",\"iteration\":3,\"detail\":{\"consecutive\":1,"
        "\"grad_norm\":null,\"loss\":4.4}}\n"
        "{\"step\":6,\"kind\":\"screen\",\"iteration\":6,\"detail\":{\"masked\":4,\"max_loss\":"
        "9.5,\"samples\":16}}\n"
        "{\"step\":8,\"kind\":\"warn\",\"iteration\":8,\"detail\":{\"alarm\":\"grad_norm\","
        "\"grad_norm\":9.0,\"grad_norm_median\":0.5,\"loss\":6.5,\"loss_median\":3.5,"
        "\"top_layers\":[{\"layer\":\"layers.0\",\"ratio\":25.5},{\"layer\":\"head\","
        "\"ratio\":3.0}]}}\n"
        "{\"step\":8,\"kind\":\"pause\",\"iteration\":9,\"detail\":{\"alarm_in_incident\":1,"
        "\"diagnosis\":\"model\",\"grad_norm\":9.0,\"grad_norm_median\":0.5,\"incident\":1,"
        "\"loss\":6.5,\"loss_median\":3.5,\"reason\":\"grad_norm\",\"rollback\":1}}\n"
        "{\"step\":4,\"kind\":\"rollback\",\"iteration\":9,\"detail\":{\"checkpoint\":"
        "\"/runs/x/checkpoints/step_00000004\",\"from_step\":8,\"incident\":1,\"quarantine\":"
        "{\"samples\":64},\"to_step\":4}}\n"
        "{\"step\":4,\"kind\":\"recovery_start\",\"iteration\":9,\"detail\":{\"incident\":1,"
        "\"lr_factor\":0.25,\"steps\":3,\"until_step\":7}}\n"
        "{\"step\":7,\"kind\":\"recovery_end\",\"iteration\":12,\"detail\":{\"lr_factor\":1.0}}\n"
        "{\"step\":10,\"kind\":\"incident_end\",\"iteration\":15,\"detail\":{\"alarms\":1,"
        "\"first_iteration\":8,\"first_step\":8,\"id\":1,\"reason\":\"grad_norm\","
        "\"rollbacks\":1,\"skipped_steps\":0}}\n");
  write(dir / "quarantine.jsonl",
        "{\"id\":90,\"step\":6,\"iteration\":6,\"reason\":\"screen\",\"loss\":9.5}\n"
        "{\"id\":64,\"step\":4,\"iteration\":9,\"reason\":\"rollback\"}\n"
        "{\"id\":65,\"step\":4,\"iteration\":9,\"reason\":\"rollback\"}\n"
        "{\"id\":66,\"step\":4,\"iteration\":9,\"reason\":\"rollback\"}\n");
  const nlohmann::json samples =
      nlohmann::json::array({{{"sample_id", 130}, {"loss", 9.25}, {"text", "first sample"}},
                             {{"sample_id", 131}, {"loss", 8.5}, {"text", "plain"}}});
  // The hostile text as raw bytes in the JSON string (the trainer replaces invalid UTF-8 with
  // U+FFFD; a hand-edited or foreign file may not).
  std::string samples_text = samples.dump(2);
  samples_text.replace(samples_text.find("first sample"), 12,
                       "<script>alert(\\\"x\\\")</script> & caf\xC3\xA9 \xFF end");
  write(dir / "forensics/step_00000008/samples.json", samples_text);
  write(dir / "forensics/step_00000008/layers.json", R"({"layers.0": 6.9, "head": 0.4})");
  write(dir / "forensics/step_00000008/signals.json", R"({"grad_norm": 9.0})");
  write(dir / "config.resolved.yaml",
        "run:\n  name: \"hand\"\n  max_steps: 12\nmodel:\n  arch: \"llama\"\n  d_model: 64\n"
        "data:\n  micro_batch_size: 16\n  grad_accum_steps: 1\nstability:\n  enabled: true\n"
        "  warn_factor: 4.0\n  pause_factor: 8.0\n  recovery:\n    lr_factor: 0.25\n"
        "faults:\n  - kind: \"lr_spike\"\n    at_step: 8\n");
  write(dir / "starts.jsonl",
        "{\"event\":\"start\",\"unix_time\":1000,\"pid\":1,\"resume\":\"\"}\n"
        "{\"event\":\"end\",\"exit\":0,\"step\":12,\"unix_time\":1012}\n");
}

TEST(LoadRun, ReadsTheTimelineTheIncidentAndItsForensics) {
  const ScratchDir dir("report_load");
  write_incident_run(dir.path());
  const RunRecord run = load_run(dir.str());

  ASSERT_EQ(run.metrics.size(), 16u);  // the truncated 17th line is skipped
  // Steps 5..8 of the first timeline were abandoned by the rollback; 1..4 and the new 5..12 kept.
  for (size_t i = 0; i < 16; ++i)
    EXPECT_EQ(run.metrics.abandoned[i], i >= 4 && i < 8) << "row " << i;
  ASSERT_NE(run.metrics.column("sample_loss.max"), nullptr);
  EXPECT_EQ(run.metrics.column("grad_norm_layers.head"), nullptr);  // per-layer maps left out
  EXPECT_DOUBLE_EQ((*run.metrics.column("recovery"))[8], 1.0);

  ASSERT_EQ(run.incidents.size(), 1u);
  const Incident& inc = run.incidents[0];
  EXPECT_EQ(inc.id, 1);
  EXPECT_EQ(inc.first_step, 8);
  EXPECT_EQ(inc.reason, "grad_norm");
  EXPECT_EQ(inc.diagnosis, "model");
  ASSERT_EQ(inc.top_layers.size(), 2u);
  EXPECT_EQ(inc.top_layers[0].first, "layers.0");
  ASSERT_EQ(inc.rollbacks.size(), 1u);
  EXPECT_EQ(inc.rollbacks[0].to_step, 4);
  EXPECT_EQ(inc.rollbacks[0].set_aside, 64);
  EXPECT_EQ(inc.steps_redone, 4);
  EXPECT_EQ(inc.quarantined, 3);  // the rollback's records, matched by its iteration
  EXPECT_EQ(inc.end_step, 10);
  ASSERT_EQ(inc.forensics.size(), 1u);
  const Forensics& f = run.forensics[inc.forensics[0]];
  EXPECT_EQ(f.step, 8);
  ASSERT_EQ(f.samples.size(), 2u);
  EXPECT_EQ(f.samples[0].id, 130);
  EXPECT_EQ(f.layer_grad_norms.front().first, "layers.0");

  EXPECT_EQ(run.quarantined, 4);
  EXPECT_EQ(run.quarantined_by_reason.at("screen"), 1);
  EXPECT_DOUBLE_EQ(run.warn_factor, 4.0);
  EXPECT_DOUBLE_EQ(run.pause_factor, 8.0);
  EXPECT_EQ(run.status.state, "finished");
  EXPECT_EQ(run.status.exit_code, 0);
  EXPECT_EQ(run.status.wall_s, 12.0);

  std::string notes;
  for (const auto& n : run.notes) notes += n + "\n";
  EXPECT_NE(notes.find("metrics.jsonl: the last line is incomplete"), std::string::npos) << notes;
  EXPECT_NE(notes.find("no eval.jsonl"), std::string::npos) << notes;
}

TEST(RenderHtml, HasThePlotsTheMarkersAndTheIncidentWithEscapedSamples) {
  const ScratchDir dir("report_render");
  write_incident_run(dir.path());
  const std::string html = render_html(load_run(dir.str()));

  for (const char* id :
       {"plot-events", "plot-loss", "plot-grad-norm", "plot-lr", "plot-data-tokens",
        "plot-data-loader-wait", "plot-data-queue", "plot-data-masked", "plot-data-sample-loss"})
    EXPECT_NE(html.find(std::string("<svg id=\"") + id + "\""), std::string::npos) << id;
  // One lane per event kind, and a marker whose tooltip describes the event.
  for (const char* lane : {">pause<", ">rollback<", ">skip_nan<", ">screen<", ">warn<",
                           ">recovery_start<", ">incident_end<"})
    EXPECT_NE(html.find(lane), std::string::npos) << lane;
  EXPECT_NE(html.find("<title>pause at step 8 (iteration 9)"), std::string::npos);
  EXPECT_NE(html.find("<title>rollback at step 4 (iteration 9)"), std::string::npos);
  // The bands at the config's factors, and the recovery window.
  EXPECT_NE(html.find("over 4x its running median"), std::string::npos);
  EXPECT_NE(html.find("over 8x its running median"), std::string::npos);
  EXPECT_NE(html.find("<title>recovery from step 4 to 7"), std::string::npos);

  // The incident row, and its forensic samples' text escaped: no markup of the run's own.
  EXPECT_NE(html.find("<tr class=\"incident\" id=\"incident-1\">"), std::string::npos);
  EXPECT_NE(html.find("step 8 &rarr; 4"), std::string::npos);
  EXPECT_NE(html.find("step_00000004"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; caf\xC3\xA9 "
                      "\xEF\xBF\xBD end"),
            std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("layers.0"), std::string::npos);

  // Self-contained: the only "http" is SVG's namespace name, which nothing fetches.
  EXPECT_EQ(count(html, "http"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_GT(count(html, "http"), 0u);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);

  // The notes, and the config summary.
  EXPECT_NE(html.find("the last line is incomplete"), std::string::npos);
  EXPECT_NE(html.find("warn_factor"), std::string::npos);
  EXPECT_NE(html.find("lr_spike"), std::string::npos);
}

// A schedule back-off (issue 47): the lr plot marks it where it happened, with its from and to
// peaks in the tooltip, and the events lane has its own row.
TEST(RenderHtml, TheLrPlotMarksAScheduleBackoff) {
  const ScratchDir dir("report_backoff");
  std::string metrics;
  for (int s = 1; s <= 6; ++s)
    metrics += "{\"step\":" + std::to_string(s) + ",\"loss\":5.0,\"lr\":0.09}\n";
  for (int s = 1; s <= 12; ++s)
    metrics += "{\"step\":" + std::to_string(s) + ",\"loss\":4.0,\"lr\":0.0285}\n";
  write(dir.path() / "metrics.jsonl", metrics);
  write(dir.path() / "events.jsonl",
        "{\"step\":0,\"kind\":\"schedule_backoff\",\"iteration\":6,\"detail\":{\"backoff\":1,"
        "\"from_lr\":0.09,\"from_step\":6,\"to_lr\":0.0285,\"to_step\":0}}\n");
  const std::string html = render_html(load_run(dir.str()));
  const size_t lr_plot = html.find("<svg id=\"plot-lr\"");
  ASSERT_NE(lr_plot, std::string::npos);
  const std::string lr_svg = html.substr(lr_plot, html.find("</svg>", lr_plot) - lr_plot);
  EXPECT_NE(lr_svg.find("<title>schedule_backoff at step 0 (iteration 6)"), std::string::npos)
      << lr_svg;
  EXPECT_NE(lr_svg.find("to_lr: 0.0285"), std::string::npos) << lr_svg;
  EXPECT_NE(html.find(">schedule_backoff<"), std::string::npos);
}

// Machine faults get a section of their own: each one's step, rank and host, what the check
// found and what became of the step; a run without any says so.
TEST(RenderHtml, MachineFaultsHaveASectionNamingRankAndHost) {
  const ScratchDir dir("report_machine");
  write(dir.path() / "metrics.jsonl", "{\"step\":1,\"loss\":5.0,\"lr\":0.001}\n");
  write(dir.path() / "events.jsonl",
        "{\"step\":30,\"kind\":\"hardware_fault\",\"iteration\":30,\"detail\":{\"cause\":"
        "\"not_reproduced\",\"ranks\":[1],\"hosts\":[\"n0 cuda:0\",\"n7 cuda:1\"],"
        "\"seconds\":0.25}}\n"
        "{\"step\":41,\"kind\":\"hardware_fault\",\"iteration\":41,\"detail\":{\"cause\":"
        "\"persistent\",\"ranks\":[1],\"hosts\":[\"n0 cuda:0\",\"n7 cuda:1\"]}}\n");
  const std::string html = render_html(load_run(dir.str()));
  const size_t at = html.find("<section id=\"machine\">");
  ASSERT_NE(at, std::string::npos);
  const std::string section = html.substr(at, html.find("</section>", at) - at);
  EXPECT_NE(section.find("2 faults"), std::string::npos) << section;
  EXPECT_EQ(count(section, "(n7 cuda:1)"), 2u) << section;
  EXPECT_NE(section.find("redone from the replay"), std::string::npos) << section;
  EXPECT_NE(section.find("saved, then the run stopped"), std::string::npos) << section;
  EXPECT_NE(section.find("0.250 s"), std::string::npos) << section;

  const ScratchDir none("report_no_machine");
  write(none.path() / "metrics.jsonl", "{\"step\":1,\"loss\":5.0,\"lr\":0.001}\n");
  EXPECT_NE(render_html(load_run(none.str())).find("<h2>Machine faults</h2>\n<p>None on record"),
            std::string::npos);
}

TEST(LoadRun, MalformedLinesAreSkippedAndCounted) {
  const ScratchDir dir("report_malformed");
  write(
      dir / "metrics.jsonl",
      "{\"step\":1,\"loss\":3.0}\nnot json at all\n{\"loss\":2.0}\n[1,2]\n"
      "{\"step\":\"two\",\"loss\":2.5}\n{\"step\":3,\"loss\":null}\n\n{\"step\":4,\"loss\":1.5}\n");
  write(dir / "events.jsonl",
        "{\"step\":1,\"kind\":\"warn\",\"detail\":[1,2]}\n{\"step\":2}\n"
        "{\"step\":3,\"kind\":\"pause\",\"detail\":{\"incident\":\"one\"}}\n\xC3\x28\n");
  RunRecord run;
  ASSERT_NO_THROW(run = load_run(dir.str()));
  ASSERT_EQ(run.metrics.size(), 3u);
  EXPECT_TRUE(std::isnan((*run.metrics.column("loss"))[1]));  // a null loss: a gap, not a row lost
  EXPECT_EQ(run.events.size(), 2u);
  EXPECT_TRUE(run.incidents.empty());  // an incident id that is not a number names none
  std::string notes;
  for (const auto& n : run.notes) notes += n + "\n";
  EXPECT_NE(notes.find("metrics.jsonl: 4 malformed lines skipped (the first is line 2)"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("events.jsonl: 2 malformed lines skipped (the first is line 2)"),
            std::string::npos)
      << notes;
  const std::string html = render_html(run);
  EXPECT_NE(html.find("4 malformed lines skipped"), std::string::npos);
}

TEST(LoadRun, ARunThatJustStartedRendersWithNothingButEvents) {
  const ScratchDir dir("report_empty");
  write(dir / "metrics.jsonl", "");
  write(dir / "events.jsonl",
        "{\"step\":0,\"kind\":\"run_start\",\"iteration\":0,\"detail\":{\"device\":\"cpu\"}}\n");
  write(dir / "starts.jsonl", "{\"event\":\"start\",\"unix_time\":1000,\"pid\":1}\n");
  write(dir / "heartbeat", "0 0 0");  // just written: a live run
  const RunRecord run = load_run(dir.str());
  EXPECT_EQ(run.metrics.size(), 0u);
  EXPECT_EQ(run.status.state, "running");
  const std::string html = render_html(run);
  EXPECT_NE(html.find("id=\"plot-loss\""), std::string::npos);
  EXPECT_NE(html.find("No loss logged yet"), std::string::npos);
  EXPECT_NE(html.find("metrics.jsonl is empty"), std::string::npos);
  EXPECT_NE(html.find("No incident"), std::string::npos);
}

TEST(LoadRun, ACrashedRunWithOnlyMetricsRenders) {
  const ScratchDir dir("report_crashed");
  write(dir / "metrics.jsonl", "{\"step\":1,\"loss\":3.0,\"lr\":0.1}\n{\"step\":2,\"loss\":2.9,");
  write(dir / "starts.jsonl", "{\"event\":\"start\",\"unix_time\":1000,\"pid\":1}\n");
  write(dir / "forensics/step_00000002/samples.json", "[{\"sample_id\":7,\"loss\":9.0,");
  write(dir / "forensics/step_00000002/layers.json", "{\"head\": 1.0}");
  const RunRecord run = load_run(dir.str());
  EXPECT_EQ(run.metrics.size(), 1u);
  EXPECT_EQ(run.status.state, "no end recorded");  // no heartbeat: not a live run
  ASSERT_EQ(run.forensics.size(), 1u);
  EXPECT_TRUE(run.forensics[0].samples.empty());
  const std::string html = render_html(run);
  EXPECT_NE(html.find("Forensics without a pause on record"), std::string::npos);
  EXPECT_NE(html.find("samples.json: not valid JSON"), std::string::npos);
  EXPECT_NE(html.find("no events.jsonl"), std::string::npos);
}

TEST(LoadRun, NotARunDirectoryIsAUserError) {
  const ScratchDir dir("report_not_a_run");
  EXPECT_THROW(load_run(dir / "missing"), UserError);
  write(dir / "notes.txt", "hello");
  try {
    load_run(dir.str());
    FAIL() << "a directory without metrics.jsonl and events.jsonl was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("neither metrics.jsonl nor events.jsonl"),
              std::string::npos)
        << e.what();
  }
}

TEST(RenderHtml, ALongRunIsDownsampledAndKeepsItsSpike) {
  const ScratchDir dir("report_long");
  std::string metrics;
  for (int s = 1; s <= 50000; ++s)
    metrics += "{\"step\":" + std::to_string(s) + ",\"loss\":" + (s == 31337 ? "77.0" : "2.0") +
               ",\"grad_norm\":0.5,\"grad_norm_median\":0.5,\"lr\":0.001}\n";
  write(dir / "metrics.jsonl", metrics);
  const std::string html = render_html(load_run(dir.str()));
  EXPECT_LT(html.size(), 600u * 1000u);  // three curves of at most 2000 points, not 50000
  EXPECT_NE(html.find("<title>train loss (50000 logged steps"), std::string::npos);
  // The spike sets the loss axis: 77 is within the frame's ticks.
  EXPECT_NE(html.find(">80</text>"), std::string::npos);
}

// Every kind of event the trainer writes has its own marker and meaning on the page, not the grey
// circle of a kind from another keel version.
TEST(EventStyles, EveryEventKindHasItsOwn) {
  const char* unknown = style_of("no_such_kind").meaning;
  for (int k = 0; k <= static_cast<int>(kLastEventKind); ++k) {
    const auto kind = static_cast<EventKind>(k);
    EXPECT_STRNE(style_of(kind).meaning, unknown) << name_of(kind);
    EXPECT_STREQ(style_of(std::string(name_of(kind))).meaning, style_of(kind).meaning);
  }
}

TEST(Svg, DownsamplingKeepsEveryBucketsExtremes) {
  std::vector<svg::Point> points;
  for (int i = 0; i < 100000; ++i) points.push_back({double(i), i == 4242 ? 100.0 : 1.0 + i % 3});
  const auto down = svg::downsample_min_max(points, 1000);
  EXPECT_LE(down.size(), 2000u);
  EXPECT_GE(down.size(), 1000u);
  bool spike = false;
  for (size_t i = 0; i < down.size(); ++i) {
    spike |= down[i].y == 100.0;
    if (i > 0) {
      EXPECT_LE(down[i - 1].x, down[i].x);
    }
  }
  EXPECT_TRUE(spike);
  const std::vector<svg::Point> few = {{0, 1}, {1, 2}, {2, std::nan("")}};
  EXPECT_EQ(svg::downsample_min_max(few, 1000).size(), 2u);  // short: unchanged but for NaN
}

TEST(Svg, EscapesMarkupAndRepairsBrokenUtf8) {
  EXPECT_EQ(svg::escape("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  EXPECT_EQ(svg::escape("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(svg::escape("a\xFF"
                        "b\x01"
                        "c"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "c");
  EXPECT_EQ(svg::escape("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // a cut sequence
  EXPECT_EQ(svg::escape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(svg::truncate_utf8("caf\xC3\xA9", 4), "caf\xE2\x80\xA6");  // never half a character
}

TEST(Svg, TicksAndLabelsAreRound) {
  EXPECT_EQ(svg::nice_ticks(0, 400, 5), (std::vector<double>{0, 100, 200, 300, 400}));
  EXPECT_EQ(svg::log_ticks(0.3, 70), (std::vector<double>{0.5, 1, 2, 5, 10, 20, 50}));
  EXPECT_EQ(svg::format_number(1095680), "1.1M");
  EXPECT_EQ(svg::format_number(2000), "2k");
  EXPECT_EQ(svg::format_number(0.0003), "3e-4");
  EXPECT_EQ(svg::format_number(1.8493748903274536), "1.849");
  EXPECT_EQ(svg::format_number(0), "0");
}

}  // namespace
}  // namespace keel::report
