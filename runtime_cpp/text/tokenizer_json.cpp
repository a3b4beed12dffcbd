// Parsing and validation of tokenizer.json into TokenizerImpl.
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/unicode/nfc.h"

namespace ninfer {
namespace detail {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& message) {
  throw std::runtime_error("tokenizer.json: " + message);
}

[[noreturn]] void unsupported(const std::string& component, const std::string& type,
                              const std::string& supported) {
  fail(component + " type '" + type + "' is not supported (supported: " + supported + ")");
}

std::string type_of(const json& node, const std::string& component) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    fail(component + " has no \"type\"");
  }
  return node["type"].get<std::string>();
}

bool flag(const json& node, const char* key, bool fallback) {
  const auto it = node.find(key);
  return it == node.end() || it->is_null() ? fallback : it->get<bool>();
}

std::optional<std::string> optional_string(const json& node, const char* key) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return std::nullopt;
  return it->get<std::string>();
}

const json& list(const json& node, const char* key, const std::string& component) {
  const auto it = node.find(key);
  if (it == node.end() || !it->is_array()) fail(component + " needs a \"" + key + "\" list");
  return *it;
}

void parse_normalizer(const json& node, TokenizerImpl& impl) {
  if (node.is_null()) return;
  const std::string type = type_of(node, "normalizer");
  if (type == "NFC") {
    impl.nfc = true;
  } else if (type == "Sequence") {
    for (const auto& child : list(node, "normalizers", "normalizer Sequence")) {
      parse_normalizer(child, impl);
    }
  } else {
    unsupported("normalizer", type, "none, NFC, Sequence");
  }
}

tok::SplitBehavior parse_behavior(const json& node) {
  const std::string name = node.value("behavior", std::string("Isolated"));
  if (name == "Removed") return tok::SplitBehavior::kRemoved;
  if (name == "Isolated") return tok::SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return tok::SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return tok::SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return tok::SplitBehavior::kContiguous;
  fail("Split behavior '" + name + "' is not supported");
}

void parse_pre_tokenizer(const json& node, TokenizerImpl& impl) {
  if (node.is_null()) return;
  const std::string type = type_of(node, "pre_tokenizer");
  tok::PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = tok::PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = flag(node, "add_prefix_space", true);
    step.use_regex = flag(node, "use_regex", true);
  } else if (type == "Split") {
    step.kind = tok::PreTokenizerStep::Kind::kSplit;
    const json& pattern = node.at("pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = tok::translate_oniguruma_pattern(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      regex = tok::escape_literal(pattern["String"].get<std::string>());
    } else {
      fail("Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    step.regex = std::make_shared<tok::Regex>(regex, "tokenizer.json: Split pattern");
    step.behavior = parse_behavior(node);
    step.invert = flag(node, "invert", false);
  } else if (type == "Sequence") {
    for (const auto& child : list(node, "pretokenizers", "pre_tokenizer Sequence")) {
      parse_pre_tokenizer(child, impl);
    }
    return;
  } else {
    unsupported("pre_tokenizer", type, "none, ByteLevel, Split, Sequence");
  }
  impl.pre_tokenizer.steps.push_back(std::move(step));
}

std::unique_ptr<tok::BpeModel> parse_model(const json& node) {
  if (!node.is_object()) fail("model is missing");
  // Old files omit the model type; HF then recognizes BPE by its merges.
  const std::string type = node.contains("type")     ? type_of(node, "model")
                           : node.contains("merges") ? "BPE"
                                                     : "(untyped)";
  if (type != "BPE") unsupported("model", type, "BPE");
  if (flag(node, "byte_fallback", false)) fail("BPE byte_fallback is not supported");
  if (node.contains("dropout") && !node["dropout"].is_null() &&
      node["dropout"].get<double>() != 0.0) {
    fail("BPE dropout is not supported");
  }
  tok::BpeConfig config;
  const json& vocab = node.at("vocab");
  if (!vocab.is_object()) fail("BPE vocab must be an object");
  config.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) config.vocab.emplace_back(token, id.get<int32_t>());
  for (const auto& merge : list(node, "merges", "BPE model")) {
    if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        fail("BPE merge '" + line + "' is not of the form 'a b'");
      }
      config.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2) {
      config.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail("BPE merge " + merge.dump() + " is neither 'a b' nor [a, b]");
    }
  }
  config.unk_token = optional_string(node, "unk_token");
  config.continuing_subword_prefix = optional_string(node, "continuing_subword_prefix");
  config.end_of_word_suffix = optional_string(node, "end_of_word_suffix");
  config.fuse_unk = flag(node, "fuse_unk", false);
  config.ignore_merges = flag(node, "ignore_merges", false);
  return std::make_unique<tok::BpeModel>(std::move(config));
}

std::vector<TemplatePiece> parse_template(const json& node) {
  std::vector<TemplatePiece> pieces;
  const json& specials = node.contains("special_tokens") ? node["special_tokens"] : json::object();
  for (const auto& item : list(node, "single", "TemplateProcessing")) {
    TemplatePiece piece;
    if (item.contains("Sequence")) {
      const std::string id = item["Sequence"].value("id", std::string("A"));
      if (id != "A") fail("TemplateProcessing single template refers to sequence '" + id + "'");
      piece.is_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      if (!specials.contains(name)) {
        fail("TemplateProcessing special token '" + name + "' is not in special_tokens");
      }
      piece.ids = specials[name].at("ids").get<std::vector<int32_t>>();
    } else {
      fail("TemplateProcessing piece " + item.dump() + " is not understood");
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

void parse_post_processor(const json& node, TokenizerImpl& impl) {
  if (node.is_null()) return;
  const std::string type = type_of(node, "post_processor");
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "TemplateProcessing") {
    impl.templates.push_back(parse_template(node));
  } else if (type == "Sequence") {
    for (const auto& child : list(node, "processors", "post_processor Sequence")) {
      parse_post_processor(child, impl);
    }
  } else {
    unsupported("post_processor", type, "none, ByteLevel, TemplateProcessing, Sequence");
  }
}

void parse_decoder(const json& node, TokenizerImpl& impl) {
  if (node.is_null()) return;
  const std::string type = type_of(node, "decoder");
  if (type == "ByteLevel") {
    impl.byte_level_decoder = true;
  } else if (type == "Sequence") {
    const json& children = list(node, "decoders", "decoder Sequence");
    if (children.size() != 1) fail("decoder Sequence is supported with one ByteLevel decoder");
    parse_decoder(children[0], impl);
  } else {
    unsupported("decoder", type, "none, ByteLevel");
  }
}

void parse_added_tokens(const json& node, TokenizerImpl& impl) {
  const tok::BpeModel& model = *impl.model;
  const auto lookup = [&model](std::string_view t) { return model.token_to_id(t); };
  if (!node.is_null()) {
    if (!node.is_array()) fail("added_tokens must be a list");
    for (const auto& item : node) {
      tok::AddedToken token;
      token.content = item.at("content").get<std::string>();
      token.special = flag(item, "special", false);
      token.single_word = flag(item, "single_word", false);
      token.lstrip = flag(item, "lstrip", false);
      token.rstrip = flag(item, "rstrip", false);
      token.normalized = flag(item, "normalized", !token.special);
      impl.added.add(token, lookup, model.num_tokens());
    }
  }
  tok::AddedVocabulary::Normalize normalize;
  if (impl.nfc) normalize = [](std::string_view s) { return unicode::nfc(s); };
  impl.added.build(normalize);
}

}  // namespace

void parse_tokenizer_json(const json& j, TokenizerImpl& impl) {
  if (!j.is_object()) fail("not a JSON object");
  for (const char* key : {"truncation", "padding"}) {
    if (j.contains(key) && !j[key].is_null()) fail(std::string(key) + " is not supported");
  }
  const json null;
  auto get = [&](const char* key) -> const json& { return j.contains(key) ? j[key] : null; };
  try {
    parse_normalizer(get("normalizer"), impl);
    parse_pre_tokenizer(get("pre_tokenizer"), impl);
    impl.model = parse_model(get("model"));
    parse_post_processor(get("post_processor"), impl);
    parse_decoder(get("decoder"), impl);
    parse_added_tokens(get("added_tokens"), impl);
  } catch (const json::exception& e) {
    fail(std::string("malformed: ") + e.what());
  }
  impl.index_tokens();
}

}  // namespace detail

Tokenizer Tokenizer::from_json(const nlohmann::json& tokenizer_json) {
  auto impl = std::make_shared<detail::TokenizerImpl>();
  detail::parse_tokenizer_json(tokenizer_json, *impl);
  return Tokenizer(std::move(impl));
}

}  // namespace ninfer
