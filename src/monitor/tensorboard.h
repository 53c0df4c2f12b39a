// TensorBoard event files (RUN_DIR/tensorboard/events.out.tfevents.*) written directly, without
// TensorFlow or a protobuf library: the few messages keel needs are encoded by hand in the .cpp.
// A file is a sequence of TFRecords (u64le length, masked CRC-32C of the length, the serialized
// Event, masked CRC-32C of the Event); its first Event names the format ("brain.Event:2").
// Scalars are Summary.Value.simple_value (float32: TensorBoard stores no more; metrics.jsonl keeps
// the exact doubles), texts are string tensors of the "text" plugin (rendered as Markdown).
// Only rank 0 writes; other ranks hold a default-constructed writer that discards. Not
// thread-safe: the trainer thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace keel::monitor {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78; crc32c("123456789") == 0xE3069283), the
// checksum of TFRecord framing. `crc` is an earlier call's result, to checksum data in pieces:
// crc32c(b, m, crc32c(a, n)) == crc32c(a followed by b).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// TFRecord stores a CRC rotated and offset, so that the CRC of data that itself holds CRCs stays
// well distributed: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;  // discards
  // Creates `dir` (with its parents) and a new events file in it, named
  // events.out.tfevents.<unix time>.<host>.<pid>.<n>, and writes the file-version event. An
  // existing file is never reused: a resumed run starts a file of its own, and TensorBoard reads
  // every file of the directory as one run. UserError when the directory or file cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();  // flushes, best effort (a destructor cannot report a failed write)
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  TensorBoardWriter(TensorBoardWriter&& other) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept;

  // Events are buffered until flush(); wall_time is the current unix time in seconds. A write that
  // fails (a full disk) throws RecordError naming the file, which is cut back to its last flushed
  // record, so that no torn record is left behind.
  void add_scalar(const std::string& tag, int64_t step, double value);  // stored as float32
  void add_text(const std::string& tag, int64_t step, const std::string& text);  // Markdown
  // A SessionLog START at `step`: readers drop what the files hold for steps >= step, as they do
  // when TensorFlow restarts from a checkpoint. Written when a resume or a rollback replays steps,
  // so that the curves show the run as it went on, not two timelines on top of each other
  // (metrics.jsonl keeps both).
  void restart_at(int64_t step);
  // Writes out what is buffered; RecordError on a failed write or when the file was deleted
  // (run directory removed). Call it once per logged step.
  void flush();

  const std::string& path() const { return path_; }  // the events file; empty when discarding

 private:
  void write_record(const std::string& event);  // frames one serialized Event as a TFRecord
  [[noreturn]] void fail(int err);

  std::FILE* file_ = nullptr;
  std::string path_;
  int64_t flushed_ = 0;  // bytes of the file known written: a failed write is cut back to here
};

}  // namespace keel::monitor
