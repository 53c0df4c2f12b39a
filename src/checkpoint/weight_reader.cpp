#include "checkpoint/weight_reader.h"

#include <algorithm>
#include <stdexcept>

#include <c10/util/accumulate.h>

#include "checkpoint/checkpointer.h"
#include "checkpoint/weight_parts.h"
#include "common/error.h"

namespace keel::checkpoint {

namespace fs = std::filesystem;

namespace {

int64_t numel_of(const std::vector<int64_t>& shape) { return c10::multiply_integers(shape); }

}  // namespace

WeightReader::WeightReader(const fs::path& checkpoint_dir) : dir_(checkpoint_dir) {
  const Manifest manifest = read_manifest(dir_);
  std::vector<std::string> listed;
  for (const auto& [name, file] : manifest.files) listed.push_back(name);
  const std::vector<std::string> files = model_files(listed);
  if (files.empty())
    throw CheckpointError((dir_ / "MANIFEST.json").string() + ": lists no model weights");
  source_ = (dir_ / (files.size() == 1 ? files[0] : "model.rank*.safetensors")).string();
  for (const auto& name : files) {
    verify_file(dir_, manifest, name);
    const fs::path path = dir_ / name;
    auto header = std::make_shared<const SafetensorsHeader>(read_safetensors_header(path));
    for (const auto& e : header->tensors) {
      std::string param;
      int64_t first = 0;
      if (is_shape_key(e.name)) {
        param = e.name.substr(0, e.name.rfind('@'));
        const int64_t dims = numel_of(e.shape);
        const torch::Tensor shape = read_safetensors_elements(path, *header, e, 0, dims);
        if (shape.scalar_type() != torch::kLong)
          throw CheckpointError(path.string() + ": " + e.name + " is not int64");
        shapes_[param] =
            std::vector<int64_t>(shape.data_ptr<int64_t>(), shape.data_ptr<int64_t>() + dims);
      } else if (parse_piece_key(e.name, &param, &first)) {
        sources_[param].push_back({first, numel_of(e.shape), path, header, &e});
      } else {
        shapes_[e.name] = e.shape;
        sources_[e.name].push_back({0, numel_of(e.shape), path, header, &e});
      }
    }
  }
  for (auto& [param, sources] : sources_) {
    std::sort(sources.begin(), sources.end(),
              [](const Source& a, const Source& b) { return a.first < b.first; });
    const auto shape = shapes_.find(param);
    if (shape == shapes_.end())
      throw CheckpointError(dir_.string() + ": the weights' parts give no shape for " + param);
    int64_t covered = 0;
    for (const auto& s : sources) {
      if (s.first != covered) break;
      covered += s.numel;
    }
    if (covered != numel_of(shape->second))
      throw CheckpointError(dir_.string() + ": the weights' parts do not cover " + param + " (" +
                            std::to_string(covered) + " of " +
                            std::to_string(numel_of(shape->second)) + " elements in order)");
  }
  for (const auto& [param, shape] : shapes_)
    if (!sources_.count(param))
      throw CheckpointError(dir_.string() + ": the weights hold a shape but no elements for " +
                            param);
}

torch::Tensor WeightReader::read(const std::string& name, int64_t first, int64_t count) const {
  const auto it = sources_.find(name);
  if (it == sources_.end())
    throw CheckpointError(dir_.string() + ": the checkpoint has no weights for " + name);
  const int64_t last = first + count;
  if (first < 0 || count < 0 || last > numel_of(shapes_.at(name)))
    throw std::out_of_range("WeightReader::read: elements outside " + name);
  torch::Tensor out = torch::empty({count}, torch::kFloat);
  for (const auto& s : it->second) {
    const int64_t from = std::max(first, s.first), to = std::min(last, s.first + s.numel);
    if (from >= to) continue;
    out.narrow(0, from - first, to - from)
        .copy_(read_safetensors_elements(s.file, *s.header, *s.entry, from - s.first, to - from));
  }
  return out;
}

torch::Tensor WeightReader::read(const std::string& name) const {
  const auto it = shapes_.find(name);
  if (it == shapes_.end())
    throw CheckpointError(dir_.string() + ": the checkpoint has no weights for " + name);
  return read(name, 0, numel_of(it->second)).view(it->second);
}

}  // namespace keel::checkpoint
