// The checkpoint data Checkpointer keeps in host memory: deep CPU copies (an async save's
// snapshot, the held stable snapshot a rollback restores from without reading the disk).
#include <cctype>
#include <cstring>

#include "checkpoint/checkpointer.h"
#include "checkpoint/file_io.h"
#include "checkpoint/layout.h"
#include "checkpoint/snapshot.h"

namespace keel::checkpoint {
namespace fs = std::filesystem;

namespace internal {

// A deep CPU copy, taken on the caller's thread, so training may modify the originals at once.
// CPU tensors are copied with one memcpy each rather than torch's copy: that one fans out to the
// intra-op thread pool, whose spinning threads make the stall erratic on a busy machine.
std::map<std::string, torch::Tensor> snapshot(const std::map<std::string, torch::Tensor>& in) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [k, t] : in) {
    torch::Tensor src = t.detach();
    torch::Tensor copy;
    if (src.device().is_cpu() && src.is_contiguous() && src.layout() == torch::kStrided) {
      copy = torch::empty(src.sizes(), src.options());
      if (src.nbytes() > 0) std::memcpy(copy.data_ptr(), src.data_ptr(), src.nbytes());
    } else {
      copy = src.to(torch::TensorOptions().device(torch::kCPU), /*non_blocking=*/false,
                    /*copy=*/true, torch::MemoryFormat::Contiguous);
    }
    out.emplace(k, std::move(copy));
  }
  return out;
}

}  // namespace internal

using namespace internal;

namespace {

uint64_t bytes_of(const std::map<std::string, torch::Tensor>& tensors) {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.defined() ? t.nbytes() : 0;
  return n;
}

uint64_t bytes_of(const CheckpointData& d) {
  return bytes_of(d.model) + bytes_of(d.optimizer) + bytes_of(d.extra_tensors);
}

CheckpointData copy_of(const CheckpointData& d) {
  CheckpointData c;
  c.model = snapshot(d.model);
  c.model_in_parts = d.model_in_parts;
  c.optimizer = snapshot(d.optimizer);
  c.extra_tensors = snapshot(d.extra_tensors);
  c.trainer_state = d.trainer_state;
  c.config_yaml = d.config_yaml;
  return c;
}

}  // namespace

void Checkpointer::set_memory_limit(uint64_t bytes) {
  wait();
  memory_limit_ = bytes;
  if (bytes == 0) candidate_ = stable_held_ = Held();
}

// A stable save replaces the held snapshot (and the candidate, older now); another save becomes
// the candidate when it fits beside the snapshot. `copy`: the data is the caller's (sync), not a
// snapshot already taken for the writer (async).
void Checkpointer::hold(int64_t step, const CheckpointData& data, bool stable, bool copy) {
  if (memory_limit_ == 0) return;
  const uint64_t bytes = bytes_of(data);
  const uint64_t beside = stable ? 0 : stable_held_.bytes;
  candidate_ = Held();
  if (bytes + beside > memory_limit_) {
    if (stable) stable_held_ = Held();  // an older snapshot is no rollback target any more
    return;
  }
  Held h{step, dir_ / step_dir_name(step), copy ? copy_of(data) : data, bytes};
  (stable ? stable_held_ : candidate_) = std::move(h);
}

std::optional<LoadedCheckpoint> Checkpointer::held_stable(std::optional<int64_t> at_most) const {
  // The held snapshot, when it is the one STABLE names and it is still committed where it was
  // (a rollback's abandon_after or retention may have moved it).
  if (stable_held_.step < 0 || (at_most && stable_held_.step > *at_most)) return std::nullopt;
  std::string named;
  try {
    named = read_file(dir_ / "STABLE");
  } catch (const CheckpointError&) {
    return std::nullopt;
  }
  while (!named.empty() && std::isspace(static_cast<unsigned char>(named.back()))) named.pop_back();
  std::error_code ec;
  if (named != stable_held_.path.filename().string() ||
      !fs::exists(stable_held_.path / kManifest, ec))
    return std::nullopt;
  return LoadedCheckpoint{stable_held_.path, copy_of(stable_held_.data), true};
}

}  // namespace keel::checkpoint
