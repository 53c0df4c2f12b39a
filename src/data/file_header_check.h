// The check every keel data file with a FileHeader (shard_format.h) passes before it is read: its
// size, magic, version, header checksum, and that the payload holds exactly `count` entries of
// `elem_bytes`. Shared by the shard reader and the provenance reader; throws DataError naming the
// file, `kind` saying what it should have been.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "data/shard_format.h"

namespace keel::data {

FileHeader check_file_header(const uint8_t* data, size_t size, const std::string& path,
                             const char (&magic)[8], const char* kind);

}  // namespace keel::data
