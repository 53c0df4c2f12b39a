#include "data/parquet_input.h"

#include <cstdio>
#include <cstring>

#include "common/error.h"

#if KEEL_HAVE_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>

#include <optional>
#endif

namespace keel::data {

bool is_parquet_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[4] = {};
  const bool ok = std::fread(magic, 1, 4, f) == 4 && std::memcmp(magic, "PAR1", 4) == 0;
  std::fclose(f);
  return ok;
}

#if KEEL_HAVE_PARQUET
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(path + ": " + what);
}

template <typename T>
T ok_or_fail(arrow::Result<T> r, const std::string& path, const char* doing) {
  if (!r.ok()) fail(path, std::string(doing) + " failed (" + r.status().ToString() + ")");
  return std::move(r).ValueOrDie();
}

bool is_text(const arrow::DataType& t) {
  return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING ||
         t.id() == arrow::Type::STRING_VIEW;
}

// Row `i` of a string-like array as a view; nullopt when null.
std::optional<std::string_view> string_at(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return std::nullopt;
  switch (a.type_id()) {
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(a).GetView(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(a).GetView(i);
    case arrow::Type::STRING_VIEW:
      return static_cast<const arrow::StringViewArray&>(a).GetView(i);
    default:
      return std::nullopt;
  }
}

}  // namespace

struct ParquetRows::Impl {
  std::string path;
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::vector<int> columns;  // text, then id when present
  bool has_id = false;
  int group = 0;
  int64_t row = 0;  // rows before the current group's
  std::shared_ptr<arrow::Table> table;
  std::shared_ptr<arrow::Array> text, id;  // the group's columns, combined into one chunk
  int64_t at = 0;                          // next row in the group

  bool load_next_group() {
    if (table) row += table->num_rows();
    table.reset();
    while (group < reader->num_row_groups()) {
      table = ok_or_fail(reader->ReadRowGroup(group++, columns), path, "reading a row group");
      text = ok_or_fail(arrow::Concatenate(table->column(0)->chunks()), path, "a text column");
      if (has_id) id = ok_or_fail(arrow::Concatenate(table->column(1)->chunks()), path, "ids");
      at = 0;
      if (table->num_rows() > 0) return true;
      table.reset();
    }
    return false;
  }
};

ParquetRows::ParquetRows(const std::string& path, const std::string& text_field,
                         const std::string& id_field)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  auto file = ok_or_fail(arrow::io::ReadableFile::Open(path), path, "opening");
  m.reader = ok_or_fail(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path,
                        "reading the parquet footer");
  std::shared_ptr<arrow::Schema> schema;
  if (auto s = m.reader->GetSchema(&schema); !s.ok())
    fail(path, "reading the schema failed (" + s.ToString() + ")");
  std::string names;
  for (const auto& f : schema->fields())
    names += (names.empty() ? "" : ", ") + f->name() + " (" + f->type()->ToString() + ")";
  const int text = schema->GetFieldIndex(text_field);
  if (text < 0 || !is_text(*schema->field(text)->type()))
    fail(path, "no string column '" + text_field +
                   "'; HINT: --text-field names the column of the "
                   "text; the file has " +
                   names);
  // ReadRowGroup takes leaf-column indices, not the schema's field indices: they differ past a
  // nested column (a struct before the text column made keel read another column as the text).
  const auto& fields = m.reader->manifest().schema_fields;
  const auto leaf = [&](int field) { return fields.at(static_cast<size_t>(field)).column_index; };
  m.columns = {leaf(text)};
  const int id = schema->GetFieldIndex(id_field);
  if (id >= 0 && id != text && leaf(id) >= 0) {  // a nested id column is not read
    m.columns.push_back(leaf(id));
    m.has_id = true;
  }
}

ParquetRows::~ParquetRows() = default;

bool ParquetRows::next(std::string& text, std::string& id, int64_t& row) {
  Impl& m = *impl_;
  while (true) {
    if ((!m.table || m.at >= m.table->num_rows()) && !m.load_next_group()) return false;
    const int64_t i = m.at++;
    const auto t = string_at(*m.text, i);
    if (!t) {
      ++null_rows_;
      continue;
    }
    text.assign(t->data(), t->size());
    bytes_ += static_cast<int64_t>(t->size());
    id.clear();
    if (m.has_id && !m.id->IsNull(i)) {
      if (const auto v = string_at(*m.id, i)) {
        id.assign(v->data(), v->size());
      } else if (auto scalar = m.id->GetScalar(i); scalar.ok()) {
        id = (*scalar)->ToString();  // an integer id, as written
      }
    }
    row = m.row + i;
    return true;
  }
}

#else  // built with -DKEEL_PARQUET=OFF

struct ParquetRows::Impl {};

ParquetRows::ParquetRows(const std::string& path, const std::string&, const std::string&) {
  throw DataError(path +
                  ": this keel was built without parquet support (-DKEEL_PARQUET=OFF, as "
                  "the GPU bundle is); HINT: prepare the data with a full build");
}

ParquetRows::~ParquetRows() = default;

bool ParquetRows::next(std::string&, std::string&, int64_t&) { return false; }

#endif

}  // namespace keel::data
