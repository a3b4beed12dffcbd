// UTF-8 helpers shared by the tokenizer, the chat templates and the grammars: code point
// iteration, validation, lossy decoding identical to Rust's String::from_utf8_lossy, JSON
// string literals, and the GPT-2 byte-level alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ninfer::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Decodes the code point starting at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next(std::string_view s, size_t& i);

// Byte length of the UTF-8 sequence whose lead byte is `lead` (1 for stray bytes).
size_t sequence_length(unsigned char lead);

void append(std::string& out, char32_t cp);

bool is_valid(std::string_view s);

// Appends the lossy decoding of `bytes` to `out`: valid sequences are copied, every maximal
// invalid subpart becomes one U+FFFD (the Rust/WHATWG rule). With `final` false an incomplete
// sequence at the end is left unconsumed. Returns the number of bytes consumed.
size_t decode_lossy(std::string_view bytes, bool final, std::string& out);

// Appends `s` (UTF-8) as a JSON string literal, quotes included, escaped as Python's
// json.dumps escapes it: \" \\ \n \r \t \b \f, other control characters as \u00XX, and with
// `ensure_ascii` every other non-ASCII code point as \uXXXX (a surrogate pair above U+FFFF);
// without it non-ASCII bytes pass through. xgrammar's EBNF reads the same escapes.
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);

// Unicode White_Space property (what Rust's char::is_whitespace and regex `\s` match).
bool is_white_space(char32_t cp);

// GPT-2 bytes_to_unicode: the UTF-8 encoding of the character standing for byte `b`.
const std::string& byte_to_unicode(unsigned char b);

// Inverse mapping: the byte a byte-level character stands for, or -1.
int unicode_to_byte(char32_t cp);

// Maps every byte of `text` to its byte-level character.
std::string to_byte_level(std::string_view text);

}  // namespace ninfer::utf8
