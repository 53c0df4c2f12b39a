// Every write of the run record is checked: a full disk or a deleted file is an error naming the
// file, never a run that trains on with no record.
#include "monitor/run_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "scratch_dir.h"

namespace keel::monitor {
namespace {

namespace fs = std::filesystem;
using keel::testing::ScratchDir;

JsonRecord a_record(int64_t step) {
  JsonRecord r;
  r.add("step", step);
  return r;
}

TEST(JsonlFile, FullDiskThrowsRecordErrorNamingTheFile) {
  JsonlFile f("/dev/full");  // every write fails with ENOSPC
  try {
    f.write(a_record(1));
    FAIL() << "a write to a full device succeeded";
  } catch (const RecordError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/dev/full"), std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
  }
}

TEST(JsonlFile, DeletedFileThrowsRecordError) {
  const ScratchDir dir("run_files_deleted");
  const fs::path path = dir.path() / "metrics.jsonl";
  JsonlFile f(path.string());
  f.write(a_record(1));
  fs::remove(path);  // as a removed run directory would
  EXPECT_THROW(f.write(a_record(2)), RecordError);
}

TEST(RecordFile, WriteToAFullDeviceThrowsRecordError) {
  EXPECT_THROW(write_record_file("/dev/full", std::string(1 << 16, 'x')), RecordError);
  EXPECT_THROW(write_record_file("/nonexistent-dir/config.resolved.yaml", "x"), RecordError);
}

TEST(JsonlFile, CompleteLinesAreWrittenAndFlushed) {
  const ScratchDir dir("run_files_lines");
  const fs::path path = dir.path() / "metrics.jsonl";
  {
    JsonlFile f(path.string());
    f.write(a_record(1));
    f.write(a_record(2));
    std::ifstream in(path);  // flushed: readable while the file is still open
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(all, "{\"step\":1}\n{\"step\":2}\n");
  }
}

}  // namespace
}  // namespace keel::monitor
