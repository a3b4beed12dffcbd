#include "text/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <new>
#include <stdexcept>

#include "text/unicode/regex_tables.h"
#include "text/utf8.h"

namespace ninfer::tok {
namespace {

// Oniguruma's `\s` for Unicode text: exactly the White_Space property.
constexpr const char* kSpaceItems =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr const char* kHexItems = "0-9A-Fa-f";

const char* category_additions(const std::string& name) {
  for (const auto& entry : regex_tables::kCategoryAdditions) {
    if (name == entry.category) return entry.class_items;
  }
  return nullptr;
}

// Class items for `\p{name}`, including characters Oniguruma's newer Unicode data adds.
std::string category_items(const std::string& name) {
  std::string items = "\\p{" + name + "}";
  if (const char* extra = category_additions(name)) items += extra;
  return items;
}

// Class items for Oniguruma's `\w`: Alphabetic, marks, decimal digits, connector punctuation,
// plus the superscript digits and vulgar fractions its Latin-1 table calls word characters.
std::string word_items() {
  return "\\p{Alphabetic}" + category_items("L") + category_items("M") + category_items("Nd") +
         "\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
}

// Emits `items` as a class: bare inside an enclosing class, bracketed (maybe negated) outside.
void emit_items(std::string& out, const std::string& items, bool in_class, bool negated) {
  if (in_class) {
    out += items;
  } else {
    out += negated ? "[^" : "[";
    out += items;
    out += ']';
  }
}

// Per-call match data: matching stays thread-safe on a shared compiled pattern.
class MatchData {
 public:
  explicit MatchData(const pcre2_code* code)
      : data_(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(data_); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* get() const { return data_; }

 private:
  pcre2_match_data* data_;
};

}  // namespace

std::string translate_oniguruma_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char x = p[i + 1];
      if ((x == 'p' || x == 'P') && i + 2 < p.size()) {
        std::string name;
        size_t next = i + 3;
        if (p[i + 2] == '{') {
          const size_t close = p.find('}', i + 3);
          if (close == std::string_view::npos) {
            out.append(p.substr(i));
            break;
          }
          name = std::string(p.substr(i + 3, close - i - 3));
          next = close + 1;
        } else {
          name = std::string(1, p[i + 2]);
        }
        bool negated = x == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.erase(0, 1);
        }
        if (category_additions(name) != nullptr && !(in_class && negated)) {
          emit_items(out, category_items(name), in_class, negated);
        } else {
          out.append(p.substr(i, next - i));
        }
        i = next;
        continue;
      }
      // Shorthand classes, rewritten with Oniguruma's Unicode meaning. Negated shorthands
      // inside a class cannot be expanded and keep PCRE2's (near-identical) meaning.
      const char lower = static_cast<char>(x | 0x20);
      const bool negated = x >= 'A' && x <= 'Z';
      std::string items;
      if (lower == 's') items = kSpaceItems;
      if (lower == 'w') items = word_items();
      if (lower == 'd') items = category_items("Nd");
      if (lower == 'h') items = kHexItems;
      if (!items.empty() && !(in_class && negated)) {
        emit_items(out, items, in_class, negated);
      } else {
        out += c;
        out += x;
      }
      i += 2;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t close = p.find(":]", i + 2);  // POSIX class, copied as is
      const size_t end = close == std::string_view::npos ? p.size() : close + 2;
      out.append(p.substr(i, end - i));
      i = end;
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
    ++i;
  }
  return out;
}

std::string escape_literal(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u) && c != '_' && c != ' ') out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pcre2_pattern, const std::string& what) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern.data()), pcre2_pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::runtime_error(what + ": cannot compile regex (" +
                             reinterpret_cast<const char*>(message) + " at offset " +
                             std::to_string(offset) + ")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::search(std::string_view subject, size_t offset, void* match_data, size_t& start,
                   size_t& end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* data = static_cast<pcre2_match_data*>(match_data);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code, s, subject.size(), offset, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code, s, subject.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data,
                     nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw std::runtime_error(std::string("regex match failed: ") +
                             reinterpret_cast<const char*>(message));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  start = ovector[0];
  end = ovector[1];
  return true;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  const MatchData data(static_cast<pcre2_code*>(code_));
  std::vector<std::pair<size_t, size_t>> matches;
  size_t offset = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (offset <= subject.size()) {
    size_t start = 0;
    size_t end = 0;
    if (!search(subject, offset, data.get(), start, end)) break;
    if (start == end && have_last && last_end == end) {
      // Empty match where the previous one ended: step over one character and retry.
      offset += offset < subject.size()
                    ? utf8::sequence_length(static_cast<unsigned char>(subject[offset]))
                    : 1;
      continue;
    }
    matches.emplace_back(start, end);
    offset = end;
    have_last = true;
    last_end = end;
  }
  return matches;
}

bool Regex::contains_match(std::string_view subject) const {
  const MatchData data(static_cast<pcre2_code*>(code_));
  size_t start = 0;
  size_t end = 0;
  return search(subject, 0, data.get(), start, end);
}

}  // namespace ninfer::tok
