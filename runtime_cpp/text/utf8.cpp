#include "text/utf8.h"

#include <array>
#include <cstdio>

namespace ninfer::utf8 {

char32_t next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t len = sequence_length(b0);
  char32_t cp = 0;
  switch (len) {
    case 1: cp = b0; break;
    case 2: cp = b0 & 0x1Fu; break;
    case 3: cp = b0 & 0x0Fu; break;
    default: cp = b0 & 0x07u; break;
  }
  for (size_t k = 1; k < len && i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  }
  i += len;
  return cp;
}

size_t sequence_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Length of the valid sequence at s[i]; 0 with `consumed` set to the length of the maximal
// invalid subpart; or -1 if the bytes up to the end are a valid but incomplete prefix.
int classify(std::string_view s, size_t i, size_t& consumed) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b == 0xE0) {
    need = 2;
    lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    need = 2;
  } else if (b == 0xED) {
    need = 2;
    hi = 0x9F;
  } else if (b == 0xF0) {
    need = 3;
    lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    need = 3;
  } else if (b == 0xF4) {
    need = 3;
    hi = 0x8F;
  } else {
    consumed = 1;
    return 0;
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) {
      consumed = j - i;
      return -1;
    }
    const auto c = static_cast<unsigned char>(s[j]);
    if (c < (k == 0 ? lo : 0x80) || c > (k == 0 ? hi : 0xBF)) {
      consumed = j - i;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t consumed = 0;
    const int len = classify(s, i, consumed);
    if (len <= 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

size_t decode_lossy(std::string_view bytes, bool final, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    size_t consumed = 0;
    const int len = classify(bytes, i, consumed);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      continue;
    }
    if (len < 0 && !final) return i;
    append(out, kReplacement);
    i += consumed;
  }
  return i;
}

namespace {

void append_u4(std::string& out, uint32_t v) {  // \uXXXX
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\u%04x", v);
  out += buf;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) append_u4(out, c);
          else out += static_cast<char>(c);
      }
      continue;
    }
    const size_t start = i;
    const char32_t cp = next(s, i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
    } else if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      append_u4(out, 0xD800 + (v >> 10));
      append_u4(out, 0xDC00 + (v & 0x3FF));
    } else {
      append_u4(out, cp);
    }
  }
  out += '"';
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> to_unicode;
  std::array<char32_t, 256> code_point{};
  std::array<int, 256 + 68> byte_of{};  // indexed by code point; -1 where no byte maps there
  ByteLevelTables() {
    byte_of.fill(-1);
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      code_point[b] = printable ? static_cast<char32_t>(b) : extra++;
      append(to_unicode[b], code_point[b]);
      byte_of[code_point[b]] = b;
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode(unsigned char b) { return tables().to_unicode[b]; }

int unicode_to_byte(char32_t cp) {
  // Printable bytes map to themselves; the other 68 bytes map to U+0100..U+0143 in order.
  const auto& byte_of = tables().byte_of;
  return cp < byte_of.size() ? byte_of[cp] : -1;
}

std::string to_byte_level(std::string_view text) {
  const auto& t = tables();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += t.to_unicode[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace ninfer::utf8
