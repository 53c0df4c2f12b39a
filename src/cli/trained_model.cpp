#include "cli/trained_model.h"

#include <fstream>

#include "checkpoint/checkpointer.h"
#include "checkpoint/weight_parts.h"
#include "common/error.h"
#include "common/paths.h"
#include "config/load.h"

namespace keel::cli {

namespace fs = std::filesystem;

fs::path find_checkpoint_dir(const fs::path& arg) {
  std::error_code ec;
  if (!fs::is_directory(arg, ec))
    throw CheckpointError(arg.string() + ": no such directory" + relative_note(arg));
  if (fs::exists(arg / "MANIFEST.json", ec)) return arg;
  const fs::path checkpoints =
      fs::is_directory(arg / "checkpoints", ec) ? arg / "checkpoints" : arg;
  auto found = checkpoint::resolve_checkpoint(checkpoints, checkpoint::Pointer::kLatest);
  if (!found)
    throw CheckpointError(checkpoints.string() +
                          ": no checkpoint here verifies (or none exists); HINT: pass a step_N "
                          "directory, a checkpoints directory or a run directory");
  return *found;
}

TrainedModel load_trained_model(const fs::path& arg) {
  const fs::path dir = find_checkpoint_dir(arg);
  checkpoint::CheckpointData data = checkpoint::load_checkpoint(dir);  // verifies as it reads
  auto loaded = config::load_config_from_string(data.config_yaml, (dir / "config.yaml").string());
  TrainedModel t;
  t.checkpoint = dir;
  t.step = checkpoint::read_manifest(dir).step;
  t.config = loaded.config;
  t.model = model::Transformer(t.config.model);
  data.model = checkpoint::whole_weights(data.model);  // a ZeRO-3 checkpoint's parts put together
  {
    torch::NoGradGuard no_grad;
    for (auto& item : t.model->named_parameters()) {
      auto it = data.model.find(item.key());
      if (it == data.model.end())
        throw CheckpointError(dir.string() + ": model.safetensors has no weights for " +
                              item.key());
      if (it->second.sizes() != item.value().sizes())
        throw CheckpointError(dir.string() + ": weight " + item.key() +
                              " has another shape than model section of its config.yaml says");
      item.value().copy_(it->second);
    }
  }
  t.model->eval();
  if (t.config.data.source == config::DataSource::kShards) {
    const fs::path meta = fs::path(t.config.data.path) / "meta.json";
    std::ifstream in(meta);
    if (!in)
      throw DataError(meta.string() + ": the prepared data this model was trained on (data.path " +
                      "in the checkpoint's config.yaml) is not there; its tokenizer is needed to " +
                      "turn text into ids\nHINT: restore the dataset directory at that path");
    const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("tokenizer"))
      throw DataError(meta.string() + ": not a keel dataset's meta.json (no tokenizer)");
    t.tokenizer = data::tokenizer_from_meta(j["tokenizer"], t.config.data.path);
  }
  return t;
}

}  // namespace keel::cli
