/// @file
/// @brief ferry's version, as macros for the preprocessor and as constants for code.
///
/// This header is the single source of the version: CMake's project() version,
/// the Conan recipe and the vcpkg port are read from or checked against it.
#pragma once

/// @brief Major version: incremented on incompatible API changes.
#define FERRY_VERSION_MAJOR 0
/// @brief Minor version: incremented on compatible additions.
#define FERRY_VERSION_MINOR 1
/// @brief Patch version: incremented on fixes.
#define FERRY_VERSION_PATCH 0
/// @brief The version as one integer, `major * 10000 + minor * 100 + patch`.
#define FERRY_VERSION (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

namespace ferry {

/// @brief The version of the ferry headers a translation unit was compiled with.
struct version_info {
  int major;  ///< incompatible API changes
  int minor;  ///< compatible additions
  int patch;  ///< fixes
};

/// @brief The version of these headers, e.g. `{0, 1, 0}`.
inline constexpr version_info version{FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH};

/// @brief The version as the string "major.minor.patch".
inline constexpr const char* version_string = "0.1.0";

}  // namespace ferry
