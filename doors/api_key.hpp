#pragma once
// The one API-key check of both doors (ZeroMQ's `api_key` field, HTTP's `Authorization: Bearer`).

#include <string_view>

namespace troupe {

// True when `given` is exactly `expected`. It takes as long whatever the keys hold, so response
// times do not tell a client how much of a guess was right: every byte of the expected key is
// compared, with no early exit. Only the expected key's length can show. Doors with no key set
// do not call it (an empty expected key matches only an empty given one).
bool api_key_matches(std::string_view given, std::string_view expected);

}  // namespace troupe
