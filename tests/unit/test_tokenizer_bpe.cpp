// Byte-level BPE (io/tokenizer_bpe) on small hand-made tokenizer.json files whose ids are worked
// out by hand here; the JSON reader's errors (file, line, JSON path) and bounds; the tokenizer's byte lengths (val_bpb's
// denominator) and mismatch rules. GPT-2's and LLaMA 3's real files are compared with an
// independent implementation in tests/integration/test_hf_tokenizer.sh.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/limits.hpp"
#include "io/tokenizer.hpp"
#include "io/tokenizer_bpe.hpp"
#include "io/json.hpp"

using namespace tessera;

namespace {

// GPT-2's bytes_to_unicode, written out again: byte b's spelling in a vocabulary, as UTF-8.
std::string spell(unsigned char b) {
  int extra = 0;
  unsigned cp = 0;
  for (int x = 0; x <= b; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    cp = printable ? unsigned(x) : 256u + unsigned(extra++);
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A tokenizer.json: ids 0..255 the bytes, then `extra` tokens (spelled as raw ASCII text, which
// the byte map leaves alone), the merges, <|eot|> special after them.
std::string tokenizer_json(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                           const std::string& pre = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})",
                           bool ignore_merges = false, const std::string& tessera = "") {
  std::string vocab;
  auto entry = [&vocab](const std::string& token, size_t id) {
    if (!vocab.empty()) vocab += ',';
    vocab += json_string(token);
    vocab += ':';
    vocab += std::to_string(id);
  };
  for (int b = 0; b < 256; ++b) entry(spell(uint8_t(b)), size_t(b));
  for (size_t i = 0; i < extra.size(); ++i) entry(extra[i], 256 + i);
  std::string m;
  for (size_t i = 0; i < merges.size(); ++i) {
    if (i) m += ',';
    m += json_string(merges[i]);
  }
  const int eot = 256 + int(extra.size());
  return R"({"version":"1.0","added_tokens":[{"id":)" + std::to_string(eot) +
         R"(,"content":"<|eot|>","special":true}],"normalizer":null,"pre_tokenizer":)" + pre +
         R"(,"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","byte_fallback":false,"ignore_merges":)" +
         (ignore_merges ? "true" : "false") + R"(,"vocab":{)" + vocab + "},\"merges\":[" + m + "]}" +
         (tessera.empty() ? "" : ",\"tessera\":" + tessera) + "}";
}

std::string error_of(const std::string& json) {
  try {
    ByteLevelBpe bpe(json, "tok.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokenizerJson, ErrorsNameLineColumnAndPath) {
  auto error = [](const std::string& text) {
    try {
      const std::string where = "t.json";
      const Json doc = parse_json(text, where, "tokenizer.json", 1 << 20, "why");
      const JsonAt root(doc, where);
      root["a"]["b c"][size_t(1)].string();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("{\"a\": 1,\n  }").rfind("t.json: not valid JSON at line 2, column 3: syntax error", 0), 0u);
  EXPECT_EQ(error("{\"a\": {\"b c\": [0, 1]}}"), "t.json: a[\"b c\"][1]: expected a string, found an integer");
  EXPECT_EQ(error("{\"a\": 7}"), "t.json: a: expected an object, found an integer");
  EXPECT_EQ(error("[]"), "t.json: the document: expected an object, found an array");
  EXPECT_EQ(error("{\"a\": {\"b c\": [0, \"x\"]}}"), "");
  // A number beyond a double, a byte-order mark, a lone surrogate, invalid UTF-8: refused.
  EXPECT_NE(error("[1e400]").find("t.json: not JSON tessera reads: number overflow"), std::string::npos);
  EXPECT_NE(error("\xEF\xBB\xBF{}").find("byte-order mark"), std::string::npos);
  EXPECT_NE(error("[\"\\ud800\"]").find("t.json: not valid JSON at line 1"), std::string::npos);
  EXPECT_NE(error("[\"\xff\"]").find("t.json: not valid JSON at line 1"), std::string::npos);
}

TEST(TokenizerJson, Bounded) {
  auto error = [](const std::string& text, int64_t max_bytes = 1 << 20) {
    try {
      parse_json(text, "t.json", "tokenizer.json", max_bytes, "why");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string deep = std::string(limits::kJsonDepth, '[') + std::string(limits::kJsonDepth, ']');
  EXPECT_EQ(error(deep), "");
  EXPECT_EQ(error("[" + deep + "]"), "t.json: not JSON tessera reads: nested more than " +
                                         std::to_string(limits::kJsonDepth) +
                                         " levels deep (a tokenizer.json nests a few)");
  // 100,000 levels: refused without a deep stack (the parser iterates; the depth check stops it).
  EXPECT_NE(error(std::string(100000, '[') + std::string(100000, ']'), 1 << 21).find("nested more than"),
            std::string::npos);
  EXPECT_NE(error(std::string(100, ' ') + "[]", 64).find("t.json: 102 bytes, more than"), std::string::npos);
}

// "abcab": pieces by GPT-2's pattern are the whole word. Merges: "b c" (rank 0), "a b" (1),
// "a bc" (2). a b c a b -> (b,c) first: a [bc] a b -> (a,bc) rank 2 vs (a,b) rank 1: the (a,b)
// at the end first: a [bc] [ab] -> [abc] [ab].
TEST(ByteLevelBpe, MergesByRank) {
  const ByteLevelBpe bpe(tokenizer_json({"bc", "ab", "abc"}, {"b c", "a b", "a bc"}), "t");
  EXPECT_EQ(bpe.vocab_size(), 260);
  EXPECT_EQ(bpe.encode("abcab"), (std::vector<int32_t>{258, 257}));
  // Equal ranks: the leftmost pair first ("aaa" -> [aa] a).
  const ByteLevelBpe aa(tokenizer_json({"aa"}, {"a a"}), "t");
  EXPECT_EQ(aa.encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(aa.encode("aaaa"), (std::vector<int32_t>{256, 256}));
}

TEST(ByteLevelBpe, IgnoreMergesTakesAWholeToken) {
  // "xyz" is in the vocabulary but no merge makes it: only ignore_merges gives it.
  const std::string without = tokenizer_json({"xyz"}, {}, R"({"type":"ByteLevel","use_regex":true})", false);
  const std::string with = tokenizer_json({"xyz"}, {}, R"({"type":"ByteLevel","use_regex":true})", true);
  EXPECT_EQ(ByteLevelBpe(without, "t").encode("xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  EXPECT_EQ(ByteLevelBpe(with, "t").encode("xyz"), (std::vector<int32_t>{256}));
}

TEST(ByteLevelBpe, PreTokenizerPieces) {
  // GPT-2's pattern: "a  b's 12" -> "a", " ", " b", "'s", " 12"; with the merge "Ġ b" (space, b)
  // the piece " b" is one token, and no merge crosses pieces ("a" + " " stay apart).
  const std::string space = spell(' ');
  const ByteLevelBpe bpe(tokenizer_json({space + "b", "a" + space}, {space + " b", "a " + space}), "t");
  EXPECT_EQ(bpe.encode("a  b's 12"),
            (std::vector<int32_t>{'a', ' ', 256, '\'', 's', ' ', '1', '2'}));
  // A Split pattern before ByteLevel (use_regex false): here digits one by one, the rest whole.
  const std::string split = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}|\\D+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]})";
  const ByteLevelBpe digits(tokenizer_json({"a" + space}, {"a " + space}, split), "t");
  EXPECT_EQ(digits.encode("a 12"), (std::vector<int32_t>{256, '1', '2'}));
  // add_prefix_space: " " before text that does not start with one.
  const ByteLevelBpe prefixed(tokenizer_json({space + "b"}, {space + " b"},
                                             R"({"type":"ByteLevel","add_prefix_space":true})"), "t");
  EXPECT_EQ(prefixed.encode("b"), (std::vector<int32_t>{256}));
}

TEST(ByteLevelBpe, AnyBytesRoundTrip) {
  const ByteLevelBpe bpe(tokenizer_json({"ab"}, {"a b"}), "t");
  const std::string bytes("ab\xff\xfe ab\xc3( \xe2\x82 caf\xc3\xa9\0x", 20);
  const std::vector<int32_t> ids = bpe.encode(bytes);
  EXPECT_EQ(bpe.decode(ids), bytes);
  EXPECT_EQ(ids[0], 256);                // "ab" before the invalid bytes
  EXPECT_EQ(ids[1], 0xFF);               // an invalid byte: a token of its own
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_EQ(bpe.decode(bpe.encode(all + all)), all + all);
}

// Bytes that are not UTF-8 (the pattern cannot match them) are pieces of their own between the
// valid text's pieces, and go through the same merges: adjacent invalid bytes may merge (GPT-2's
// truncated emoji prefix F0 9F 98 is its token 47249), an invalid byte no merge takes stays a
// token of its own, and decoding gives every byte back.
TEST(ByteLevelBpe, InvalidBytesMergeAsAnyBytes) {
  const std::string f0 = spell(0xF0), x9f = spell(0x9F);
  const ByteLevelBpe bpe(tokenizer_json({f0 + x9f}, {f0 + " " + x9f}), "t");
  const std::string text = "a\xF0\x9F\x98" "b";
  const std::vector<int32_t> ids = bpe.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', 256, 0x98, 'b'}));
  EXPECT_EQ(bpe.decode(ids), text);
  // A lone invalid byte, and two no merge takes, stay bytes.
  EXPECT_EQ(bpe.encode("\x9F\xF0"), (std::vector<int32_t>{0x9F, 0xF0}));
}

TEST(ByteLevelBpe, SpecialTokens) {
  const ByteLevelBpe bpe(tokenizer_json({"ab"}, {"a b"}, R"({"type":"ByteLevel"})", false,
                                        R"({"bos_token_id":null,"eos_token_id":[257, 3],"pad_token_id":0})"),
                         "t");
  EXPECT_EQ(bpe.eos(), 257);  // the first of a list
  EXPECT_EQ(bpe.bos(), -1);
  EXPECT_EQ(bpe.pad(), 0);
  EXPECT_TRUE(bpe.is_special(257));
  EXPECT_EQ(bpe.added_token("<|eot|>"), 257);
  EXPECT_EQ(bpe.decode({'x', 257, 256}), "xab");                  // specials decode to nothing
  EXPECT_EQ(bpe.encode("<|eot|>").size(), 7u);                     // and are never made from text
}

TEST(ByteLevelBpe, UnsupportedKindsAreOneLine) {
  const std::string ok = tokenizer_json({}, {});
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = ok;
    s.replace(s.find(from), from.size(), to);
    return error_of(s);
  };
  EXPECT_EQ(with(R"("type":"BPE")", R"("type":"Unigram")"),
            "tok.json: model type 'Unigram' (tessera reads byte-level BPE tokenizer.json files, as GPT-2 and LLaMA 3 have)");
  EXPECT_NE(with(R"("normalizer":null)", R"("normalizer":{"type":"NFC"})").find("tok.json: normalizer: type 'NFC'"), std::string::npos);
  EXPECT_NE(with(R"("byte_fallback":false)", R"("byte_fallback":true)").find("byte_fallback"), std::string::npos);
  EXPECT_NE(with(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})", R"({"type":"Metaspace"})")
                .find("tok.json: pre_tokenizer: type 'Metaspace'"),
            std::string::npos);
  EXPECT_NE(with(R"("decoder":{"type":"ByteLevel"})", R"("decoder":{"type":"WordPiece"})").find("tok.json: decoder: type 'WordPiece'"),
            std::string::npos);
  EXPECT_EQ(with(R"("merges":[])", R"("merges":["a"])"),
            "tok.json: model.merges[0]: 'a' is not two tokens separated by one space");
  EXPECT_NE(with(R"("merges":[])", R"("merges":["a qq"])").find("'qq' is not in model.vocab"), std::string::npos);
  EXPECT_NE(with("\"a\":97,", "").find("tok.json: model.vocab: byte 0x61"), std::string::npos);
  EXPECT_EQ(error_of("[1]").rfind("tok.json: the document: expected an object", 0), 0u);
}

// Values of the wrong kind name their JSON path and what was expected there.
TEST(ByteLevelBpe, WrongTypesNameTheirPath) {
  const std::string pre =
      R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\d"},"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]})";
  const std::string ok = tokenizer_json({}, {}, pre);
  ASSERT_EQ(error_of(ok), "");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = ok;
    s.replace(s.find(from), from.size(), to);
    return error_of(s);
  };
  EXPECT_EQ(with(R"({"Regex":"\\d"})", R"("\\d")"),
            "tok.json: pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\": \"...\"} (tessera reads "
            "byte-level BPE: a ByteLevel pre-tokenizer, alone or after Split patterns, as GPT-2 and LLaMA 3 "
            "have), found a string");
  EXPECT_EQ(with(R"("pretokenizers":[)", R"("pretokenizers":7,"x":[)"),
            "tok.json: pre_tokenizer.pretokenizers: expected an array of pre-tokenizers, found an integer");
  EXPECT_EQ(with(R"("added_tokens":[)", R"("added_tokens":3,"x":[)"),
            "tok.json: added_tokens: expected an array of tokens, found an integer");
  EXPECT_EQ(with(R"("use_regex":false)", R"("use_regex":"no")"),
            "tok.json: pre_tokenizer.pretokenizers[1].use_regex: expected true, false or null, found a string");
  EXPECT_EQ(with(R"("a":97)", R"("a":97.0)"),
            "tok.json: model.vocab.a: expected an integer from 0 to 16777215, found a number with a fraction or "
            "exponent");
  EXPECT_EQ(with(R"("content":"<|eot|>")", R"("content":["<|eot|>"])"),
            "tok.json: added_tokens[0].content: expected a string, found an array");
  EXPECT_EQ(with(R"("model":{"type":"BPE")", R"("model":{"type":5)"),
            "tok.json: model type '?' (tessera reads byte-level BPE tokenizer.json files, as GPT-2 and LLaMA 3 have)");
  EXPECT_EQ(with(R"("merges":[])", R"("merges":[["a"]])"),
            "tok.json: model.merges[0]: expected a string \"a b\" or a pair [\"a\", \"b\"], found an array");
  // A model without its type but with merges is a BPE (older Hugging Face files).
  EXPECT_EQ(with(R"("model":{"type":"BPE",)", R"("model":{)"), "");
}

// 100,000 Split steps: refused by the step limit, and an encode through the most steps allowed
// iterates (no call per step).
TEST(ByteLevelBpe, PreTokenizerStepsBounded) {
  const std::string step = R"({"type":"Split","pattern":{"Regex":"\\w+| "},"behavior":"Isolated"},)";
  auto with_steps = [&](int n) {
    std::string steps;
    for (int i = 0; i < n; ++i) steps += step;
    return tokenizer_json({}, {}, R"({"type":"Sequence","pretokenizers":[)" + steps +
                                      R"({"type":"ByteLevel","use_regex":false}]})");
  };
  EXPECT_NE(error_of(with_steps(100000)).find("tok.json: pre_tokenizer.pretokenizers: 100001 entries, more than the " +
                                              std::to_string(limits::kPreTokenizerSteps)),
            std::string::npos);
  const ByteLevelBpe most(with_steps(limits::kPreTokenizerSteps - 1), "t");
  EXPECT_EQ(most.decode(most.encode("ab cd")), "ab cd");
  EXPECT_EQ(most.encode("ab cd"), (std::vector<int32_t>{'a', 'b', ' ', 'c', 'd'}));
}

TEST(Tokenizer, ByteLengthsSumToTheText) {
  TokenizerInfo hf;
  hf.type = "hf-bpe";
  hf.model = tokenizer_json({"ab", "abab"}, {"a b", "ab ab"}, R"({"type":"ByteLevel"})", false,
                            R"({"bos_token_id":258,"eos_token_id":258})");
  hf.vocab_size = 259;
  hf.eot = 258;
  const Tokenizer t(hf, "t");
  const std::string text = "abab ab\xff caf\xc3\xa9\n";
  const std::vector<int32_t> ids = t.encode(text);
  const std::vector<uint32_t> bytes = t.token_byte_lengths();
  uint64_t sum = 0;
  for (int32_t id : ids) sum += bytes[size_t(id)];
  EXPECT_EQ(sum, text.size());
  EXPECT_EQ(bytes[257], 4u);
  EXPECT_EQ(bytes[258], 0u);   // eot
  EXPECT_EQ(t.bos(), -1);      // bos == eot: nothing before a document
  TokenizerInfo byte;
  byte.vocab_size = 257;
  byte.eot = 256;
  const std::vector<uint32_t> b = Tokenizer(byte, "b").token_byte_lengths();
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0u), 256u);
}

TEST(Tokenizer, Mismatch) {
  TokenizerInfo byte;
  byte.vocab_size = 257;
  byte.eot = 256;
  TokenizerInfo a, b, none;
  a.type = b.type = "hf-bpe";
  a.vocab_size = b.vocab_size = 259;
  a.model = "{1}";
  b.model = "{2}";
  none.type = "none";
  none.vocab_size = 259;
  EXPECT_EQ(tokenizer_mismatch(a, "A", a, "B"), "");
  EXPECT_EQ(tokenizer_mismatch(a, "A", none, "B"), "");  // none knows no more than its size
  EXPECT_NE(tokenizer_mismatch(a, "A", b, "B").find("the same ids mean different text"), std::string::npos);
  EXPECT_NE(tokenizer_mismatch(a, "A", byte, "B").find("their vocabularies differ"), std::string::npos);
  EXPECT_EQ(tokenizer_hash(a).size(), 16u);
  EXPECT_NE(tokenizer_hash(a), tokenizer_hash(b));
}
