#pragma once
// Reads platform presets (JSON) into a Platform.
//
// One schema, one loader, one set of error messages, shared by Python and by
// C++ programs. A file may name a `"base"` preset and give only the fields it
// changes; overrides (`--set path.to.field=value`) apply last. Every error is
// a ConfigError naming the field and what is allowed.

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "platform.h"

namespace zion::sim {

// A message may quote a user's file; bytes that are not UTF-8 are written as
// \xNN, so the message reaches Python (and any UTF-8 terminal) intact.
class ConfigError : public std::invalid_argument {
 public:
  explicit ConfigError(const std::string& what);
};

// `text` with every byte that is not part of a well-formed UTF-8 sequence written as \xNN.
std::string escape_invalid_utf8(const std::string& text);

// A dotted field path ("oam.peak_flops.bf16", "pcie.switches.0.oams") and a
// value. The value is JSON text; text that is not valid JSON is taken as a
// string, so `--set fabric.topology=ring` works without quotes.
using Override = std::pair<std::string, std::string>;

// Splits "path=value" as written on a command line.
Override parse_override(const std::string& assignment);

// Directories searched for "<name>.json" when a preset is named. Defaults to
// the ZION_PLATFORM_PATH environment variable (':'-separated) followed by the
// directory the project installed its presets into.
std::vector<std::string> default_preset_dirs();
void set_default_preset_dirs(std::vector<std::string> dirs);

// Names of the presets found in `dirs`, sorted.
std::vector<std::string> preset_names(const std::vector<std::string>& dirs);

// `name_or_path`: a preset name ("zion") or a path to a .json file.
Platform load_platform(const std::string& name_or_path,
                       const std::vector<Override>& overrides = {},
                       const std::vector<std::string>& dirs = default_preset_dirs());

// The files a platform reads: `name_or_path` and each "base" it names in
// turn, as found (a preset's own file included).
std::vector<std::string> platform_files(const std::string& name_or_path,
                                        const std::vector<std::string>& dirs = default_preset_dirs());

// Parses JSON text that already holds every field (no "base").
Platform platform_from_json_text(const std::string& text, const std::string& origin);

}  // namespace zion::sim
