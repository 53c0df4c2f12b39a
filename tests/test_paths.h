// The absolute paths the tests need: the keel binary under test, the checkout, the golden files.
// Defined in one unit that CMake generates (tests/CMakeLists.txt), not as compile definitions:
// a path of the checkout on every test unit's command line would keep ccache from sharing their
// objects between two clones.
#pragma once

namespace keel::testing {

extern const char* const kKeelBinary;
extern const char* const kSourceDir;
extern const char* const kGoldenDir;

}  // namespace keel::testing
