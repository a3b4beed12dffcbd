// Stop strings: the StopMatcher alone (Unicode and multi-byte stops, stops split across
// pieces, several at once, what is held back and when it is released), behind a
// byte-level StreamDecoder as the engine runs it (tokens that split characters), and in
// the engine (stops spanning tokens; held text released when the request ends on its
// length or on an end-of-sequence token).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/stop_matcher.h"
#include "harness.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace ninfer::fake {
namespace {

struct Stopped {
  std::vector<std::string> chunks;  // what each feed released, then finish's release
  bool stopped = false;
  std::string text() const {
    std::string t;
    for (const auto& c : chunks) t += c;
    return t;
  }
};

// Feeds `pieces` in order; ends with finish("") unless a stop string matched.
Stopped feed(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Stopped out;
  for (const std::string& p : pieces) {
    const StopMatcher::Result r = m.feed(p);
    out.chunks.push_back(r.text);
    if (r.stopped) {
      out.stopped = true;
      CHECK(m.stopped() && m.feed("more").text.empty());  // nothing after a stop
      return out;
    }
  }
  out.chunks.push_back(m.finish("").text);
  return out;
}

std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    utf8::next(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

void test_matcher() {
  // Split across pieces: the text before the stop comes out, the stop never does.
  Stopped s = feed({"</s>"}, {"hel", "lo<", "/", "s>tail"});
  CHECK(s.stopped && s.text() == "hello");
  CHECK((s.chunks == std::vector<std::string>{"hel", "lo", "", ""}));  // "<" held back
  // Held text that turns out not to be a stop is released with what follows it...
  s = feed({"<|end|>"}, {"a<|e", "nd", "x"});
  CHECK(!s.stopped && (s.chunks == std::vector<std::string>{"a", "", "<|endx", ""}));
  // ...or at the end of generation.
  s = feed({"<|end|>"}, {"ab<|en"});
  CHECK(!s.stopped && (s.chunks == std::vector<std::string>{"ab", "<|en"}));
  // Several stops: the one that starts first wins, whatever their order in the list.
  CHECK(feed({"xyz", "y"}, {"axyzq"}).text() == "a");
  CHECK(feed({"b", "abc"}, {"zabcq"}).text() == "z");
  CHECK(feed({"q", "zz"}, {"zzq"}).text() == "");
  // Empty stop strings are ignored.
  s = feed({""}, {"abc"});
  CHECK(!s.stopped && s.text() == "abc");

  // Unicode, one character at a time: the first 日 is held (it could start 日本) and
  // released with は; the second starts the stop.
  s = feed({"日本"}, characters("今日は日本語です"));
  CHECK(s.stopped && s.text() == "今日は");
  CHECK((s.chunks == std::vector<std::string>{"今", "", "日は", "", ""}));
  // A stop sharing a lead byte with the text does not hold it: è (C3 A8) vs é (C3 A9).
  s = feed({"é"}, {"caf", "è", "!"});
  CHECK(!s.stopped && (s.chunks == std::vector<std::string>{"caf", "è", "!", ""}));
  s = feed({"é!"}, {"café", "?"});
  CHECK(!s.stopped && (s.chunks == std::vector<std::string>{"caf", "é?", ""}));
  // Four-byte characters in the stop and in the text.
  s = feed({"🚀!"}, {"go 🚀", "🚀", "!"});
  CHECK(s.stopped && (s.chunks == std::vector<std::string>{"go ", "🚀", ""}));
  CHECK(s.text() == "go 🚀");
  for (const std::string& c : s.chunks) CHECK(utf8::is_valid(c));
}

// A byte-level tokenizer with one token per byte, so that every multi-byte character
// spans several tokens.
Tokenizer bytes_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[utf8::byte_to_unicode(static_cast<unsigned char>(b))] = b;
  const nlohmann::json merges = nlohmann::json::array();
  return Tokenizer::from_json({{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                               {"pre_tokenizer", {{"type", "ByteLevel"}}},
                               {"decoder", {{"type", "ByteLevel"}}}});
}

// `text` one byte per token through StreamDecoder and StopMatcher, as Engine::on_token
// does; every release is whole characters.
Stopped decode_and_stop(const Tokenizer& tok, const std::vector<std::string>& stops,
                        const std::string& text) {
  StreamDecoder decoder(tok, true);
  StopMatcher m(stops);
  Stopped out;
  for (unsigned char byte : text) {
    const StopMatcher::Result r = m.feed(decoder.push(byte));
    CHECK(utf8::is_valid(r.text));
    out.chunks.push_back(r.text);
    if (r.stopped) {
      out.stopped = true;
      return out;
    }
  }
  out.chunks.push_back(m.finish(decoder.flush()).text);
  return out;
}

void test_byte_tokens() {
  const Tokenizer tok = bytes_tokenizer();
  const std::string text = "café 日本 🚀 done";
  Stopped s = decode_and_stop(tok, {"日本"}, text);
  CHECK(s.stopped && s.text() == "café ");
  s = decode_and_stop(tok, {"本 🚀"}, text);  // spans three characters and seven tokens
  CHECK(s.stopped && s.text() == "café 日");
  s = decode_and_stop(tok, {"🚀 x", "é 日本 🚀 dont"}, text);  // held long, then released
  CHECK(!s.stopped && s.text() == text);
}

// One request to the fake model through the engine: greedy, or sampled with `seed`.
Outcome generate(Engine& engine, std::vector<int32_t> prompt, int max_tokens, bool ignore_eos,
                 std::vector<std::string> stop = {}, int seed = -1) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = seed < 0 ? 0.0f : 1.0f;
  r.seed = seed < 0 ? 0 : static_cast<uint64_t>(seed);
  r.ignore_eos = ignore_eos;
  r.stop = std::move(stop);
  return collect(*engine.submit(r));
}

void test_engine_stops() {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(2, 8, 1 + 2 * 16, 4, 64);
  Engine engine(model, tok, {kEos}, EngineOptions{});
  // A greedy request whose 12 tokens are all letters (the end-of-sequence token, ignored
  // here, has no text). The letters decode with a space between tokens.
  Outcome base;
  std::vector<int32_t> letters_prompt;
  auto has_eos = [](const Outcome& o) {
    return std::find(o.tokens.begin(), o.tokens.end(), kEos) != o.tokens.end();
  };
  for (int32_t a = 0; a < 26 && (base.tokens.empty() || has_eos(base)); ++a) {
    letters_prompt = {a, 5, 6};
    base = generate(engine, letters_prompt, 12, true);
  }
  CHECK(base.finish == "length" && base.tokens.size() == 12 && !has_eos(base));
  CHECK(base.text == tok.decode(base.tokens, true) && base.text.size() == 23);
  // A stop spanning three tokens: the text before it, every token up to the one that
  // completed it, finish_reason "stop".
  const std::string stop = base.text.substr(8, 5);
  const size_t at = base.text.find(stop);
  size_t completed = 1;
  while (tok.decode({base.tokens.begin(), base.tokens.begin() + completed}, true).find(stop) ==
         std::string::npos)
    ++completed;
  Outcome o = generate(engine, letters_prompt, 12, true, {stop});
  CHECK(o.finish == "stop" && o.text == base.text.substr(0, at));
  CHECK(o.tokens == std::vector<int32_t>(base.tokens.begin(), base.tokens.begin() + completed));
  CHECK(o.timings.predicted_n == static_cast<int>(completed));
  // Several at once: the earliest in the text wins.
  const std::string later = base.text.substr(16, 3), earlier = base.text.substr(2, 3);
  o = generate(engine, letters_prompt, 12, true, {later, earlier});
  const size_t first = std::min(base.text.find(earlier), base.text.find(later));
  CHECK(o.finish == "stop" && o.text == base.text.substr(0, first));
  // The last letter could start a stop ("<last>#", never generated): it is held back,
  // and released when the request ends on its length.
  o = generate(engine, letters_prompt, 12, true, {base.text.substr(22) + "#"});
  CHECK(o.finish == "length" && o.text == base.text && o.tokens == base.tokens);

  // The same at an end-of-sequence token: find a seed whose sampled request ends with one
  // (greedy never picks it: the fake model lowers its logit).
  Outcome eos;
  int seed = 0;
  for (; seed < 1000; ++seed) {
    eos = generate(engine, {1, 2}, 40, false, {}, seed);
    if (eos.finish == "stop" && eos.timings.predicted_n > 1 &&
        eos.timings.predicted_n == static_cast<int>(eos.tokens.size()) + 1)
      break;
  }
  CHECK(seed < 1000);
  o = generate(engine, {1, 2}, 40, false, {eos.text.substr(eos.text.size() - 1) + "#"}, seed);
  CHECK(o.finish == "stop" && o.text == eos.text && o.tokens == eos.tokens);
  CHECK(o.timings.predicted_n == eos.timings.predicted_n);
}

}  // namespace

void test_stops() {
  test_matcher();
  test_byte_tokens();
  test_engine_stops();
  std::puts("stops ok");
}

}  // namespace ninfer::fake
