#include "policies/tokenizer/hf_bpe_model.h"

#include <algorithm>
#include <queue>

#include "absl/strings/str_cat.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies::internal {

void ParseBpeModel(const Json& model, BpeModel* bpe) {
  const std::string where = "model";
  if (!model.is_object()) Fail("model must be an object");
  const Json* type = Find(model, "type");
  if (type != nullptr && (!type->is_string() || type->get<std::string>() != "BPE")) {
    Unsupported("model", type->is_string() ? type->get<std::string>() : type->dump());
  }
  if (type == nullptr && Find(model, "merges") == nullptr) {
    Fail("model has no \"type\" and no \"merges\"; only BPE models are supported");
  }
  if (const Json* dropout = Find(model, "dropout");
      dropout != nullptr && (!dropout->is_number() || dropout->get<double>() > 0.0)) {
    Fail("model.dropout is set; BPE dropout is not supported");
  }
  const Json& vocab = Require(model, "vocab", where);
  if (!vocab.is_object()) Fail("model.vocab must be an object");
  for (const auto& [token, id] : vocab.items()) {
    bpe->vocab[token] = CheckedId(id, absl::StrCat("model.vocab[\"", token, "\"]"));
  }
  bpe->byte_fallback = OptionalBool(model, "byte_fallback", false, where);
  bpe->fuse_unk = OptionalBool(model, "fuse_unk", false, where);
  bpe->ignore_merges = OptionalBool(model, "ignore_merges", false, where);
  if (const Json* prefix = Find(model, "continuing_subword_prefix"); prefix != nullptr) {
    bpe->continuing_subword_prefix = RequireString(model, "continuing_subword_prefix", where);
  }
  if (const Json* suffix = Find(model, "end_of_word_suffix"); suffix != nullptr) {
    bpe->end_of_word_suffix = RequireString(model, "end_of_word_suffix", where);
  }
  if (Find(model, "unk_token") != nullptr) {
    const std::string unk = RequireString(model, "unk_token", where);
    const auto it = bpe->vocab.find(unk);
    if (it == bpe->vocab.end()) Fail(absl::StrCat("model.unk_token \"", unk, "\" is not in the vocab"));
    bpe->unk_id = it->second;
  }
  bpe->byte_ids.fill(-1);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = absl::StrCat("<0x", std::string(1, kHex[b >> 4]), std::string(1, kHex[b & 15]), ">");
    if (const auto it = bpe->vocab.find(name); it != bpe->vocab.end()) {
      bpe->byte_ids[static_cast<size_t>(b)] = it->second;
    }
  }

  const Json& merges = Require(model, "merges", where);
  if (!merges.is_array()) Fail("model.merges must be an array");
  const size_t prefix_len = bpe->continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) Fail(absl::StrCat("model.merges[", rank, "] has no space: \"", s, "\""));
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      Fail(absl::StrCat("model.merges[", rank, "] must be \"a b\" or [\"a\", \"b\"]"));
    }
    const auto l = bpe->vocab.find(left);
    const auto r = bpe->vocab.find(right);
    if (l == bpe->vocab.end() || r == bpe->vocab.end()) {
      Fail(absl::StrCat("model.merges[", rank, "] uses a token that is not in the vocab"));
    }
    // The right part's continuing-subword prefix is not repeated in the merge.
    const std::string merged = left + (right.size() >= prefix_len ? right.substr(prefix_len) : right);
    const auto n = bpe->vocab.find(merged);
    if (n == bpe->vocab.end()) {
      Fail(absl::StrCat("model.merges[", rank, "]: merged token \"", merged, "\" is not in the vocab"));
    }
    bpe->merges[(static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) | static_cast<uint32_t>(r->second)] = {
        static_cast<int32_t>(rank), n->second};
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    if (const auto it = vocab.find(std::string(word)); it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // Hugging Face's Word: a linked list of symbols merged by lowest merge
  // rank, leftmost first.
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    size_t length;  // bytes; 0 once merged away
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, size_t length) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, length});
  };
  // Bytes covered by the unknown token not yet added (0: none); consecutive
  // unknown characters share one token when fuse_unk.
  size_t pending_unk = 0;
  const std::string_view w = word;
  for (size_t pos = 0; pos < w.size();) {
    const size_t length = DecodeUtf8Char(w.substr(pos)).length;
    std::string s(w.substr(pos, length));
    if (pos > 0 && !continuing_subword_prefix.empty()) s.insert(0, continuing_subword_prefix);
    if (pos + length == w.size()) s += end_of_word_suffix;
    pos += length;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (pending_unk > 0) add(unk_id, pending_unk);
      pending_unk = 0;
      add(it->second, length);
      continue;
    }
    if (byte_fallback &&
        std::all_of(s.begin(), s.end(), [&](char b) { return byte_ids[static_cast<uint8_t>(b)] >= 0; })) {
      for (char b : s) add(byte_ids[static_cast<uint8_t>(b)], 1);
      continue;
    }
    if (unk_id >= 0) {
      if (pending_unk > 0 && !fuse_unk) {
        add(unk_id, pending_unk);
        pending_unk = 0;
      }
      pending_unk += length;
    }
    // Without an unk token an unknown character is dropped, as in Hugging Face.
  }
  if (pending_unk > 0) add(unk_id, pending_unk);

  struct Merge {
    int pos;
    int32_t rank;
    int32_t new_id;
  };
  struct Later {
    bool operator()(const Merge& a, const Merge& b) const { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, Later> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = FindMerge(symbols[i].id, symbols[i + 1].id); m != nullptr) {
      queue.push({static_cast<int>(i), m->first, m->second});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& current = symbols[static_cast<size_t>(top.pos)];
    if (current.length == 0 || current.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(current.next)];
    // Stale entry: the pair at this position changed since it was queued.
    const auto* m = FindMerge(current.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;
    current.id = top.new_id;
    current.length += right.length;
    current.next = right.next;
    right.length = 0;
    if (current.next >= 0) symbols[static_cast<size_t>(current.next)].prev = top.pos;
    if (current.prev >= 0) {
      const Symbol& prev = symbols[static_cast<size_t>(current.prev)];
      if (const auto* pm = FindMerge(prev.id, current.id); pm != nullptr) {
        queue.push({current.prev, pm->first, pm->second});
      }
    }
    if (current.next >= 0) {
      const Symbol& next = symbols[static_cast<size_t>(current.next)];
      if (const auto* nm = FindMerge(current.id, next.id); nm != nullptr) {
        queue.push({top.pos, nm->first, nm->second});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.length > 0) ids->push_back(s.id);
  }
}

}  // namespace strata::policies::internal
