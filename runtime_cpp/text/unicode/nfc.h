// Unicode NFC normalization (canonical decomposition, canonical ordering, canonical
// composition) over UTF-8, with tables from nfc_tables.h.
#pragma once

#include <string>
#include <string_view>

namespace ninfer::unicode {

// NFC of `text`, which must be valid UTF-8.
std::string nfc(std::string_view text);

}  // namespace ninfer::unicode
