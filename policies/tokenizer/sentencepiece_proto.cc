// ParseSentencePieceModelProto: sentencepiece's ModelProto read straight off
// the protobuf wire format, without libprotobuf.
#include "policies/tokenizer/sentencepiece_model.h"

#include <bit>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace strata::policies {
namespace {

using PieceType = SentencePieceModelProto::PieceType;
using ModelType = SentencePieceModelProto::ModelType;

// Protobuf wire format. Only what ModelProto needs: varints, 32/64-bit fixed,
// length-delimited fields, and skipping groups of unknown fields.

enum WireType : int { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

class WireReader {
 public:
  // `base` is the offset of `data` in the file, so errors point at the byte.
  WireReader(std::string_view data, size_t base) : data_(data), base_(base) {}

  bool AtEnd() const { return pos_ >= data_.size(); }
  const std::string& error() const { return error_; }

  bool ReadTag(uint32_t* field, int* wire_type) {
    uint64_t tag = 0;
    if (!ReadVarint(&tag)) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    if (*field == 0 || tag >> 32 != 0) return Fail("invalid field number");
    if (*wire_type > kFixed32) return Fail(absl::StrCat("invalid wire type ", *wire_type));
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Fail("truncated varint");
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      result |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return Fail("varint longer than 10 bytes");
  }

  bool ReadFixed32(uint32_t* value) {
    if (data_.size() - pos_ < 4) return Fail("truncated fixed32");
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(data_[pos_ + i]);
    pos_ += 4;
    *value = v;
    return true;
  }

  // A length-delimited payload, and the file offset where it starts.
  bool ReadBytes(std::string_view* bytes, size_t* offset) {
    uint64_t length = 0;
    if (!ReadVarint(&length)) return false;
    if (length > data_.size() - pos_) return Fail("length-delimited field runs past the end");
    *offset = base_ + pos_;
    *bytes = data_.substr(pos_, static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return true;
  }

  // Skips the payload of a field whose tag was just read.
  bool Skip(uint32_t field, int wire_type, int depth = 0) {
    uint64_t ignored64 = 0;
    uint32_t ignored32 = 0;
    std::string_view ignored_bytes;
    size_t ignored_offset = 0;
    switch (wire_type) {
      case kVarint:
        return ReadVarint(&ignored64);
      case kFixed64:
        if (data_.size() - pos_ < 8) return Fail("truncated fixed64");
        pos_ += 8;
        return true;
      case kLengthDelimited:
        return ReadBytes(&ignored_bytes, &ignored_offset);
      case kFixed32:
        return ReadFixed32(&ignored32);
      case kStartGroup: {
        if (depth > 64) return Fail("groups nested too deeply");
        while (true) {
          if (AtEnd()) return Fail("unterminated group");
          uint32_t inner_field = 0;
          int inner_type = 0;
          if (!ReadTag(&inner_field, &inner_type)) return false;
          if (inner_type == kEndGroup) {
            return inner_field == field ? true : Fail("mismatched end of group");
          }
          if (!Skip(inner_field, inner_type, depth + 1)) return false;
        }
      }
      default:
        return Fail("unexpected end of group");
    }
  }

  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat(what, " at byte ", base_ + pos_);
    return false;
  }

 private:
  std::string_view data_;
  size_t base_;
  size_t pos_ = 0;
  std::string error_;
};

// Readers for the typed fields of a message. Each checks the wire type, since
// a mismatch means the bytes are not the message we think they are.
class MessageParser {
 public:
  explicit MessageParser(WireReader* reader) : r_(reader) {}

  bool Expect(uint32_t field, int wire_type, int expected) {
    if (wire_type == expected) return true;
    return r_->Fail(absl::StrCat("field ", field, " has wire type ", wire_type, ", expected ", expected));
  }
  bool Varint(uint32_t field, int wire_type, uint64_t* value) {
    return Expect(field, wire_type, kVarint) && r_->ReadVarint(value);
  }
  bool Bool(uint32_t field, int wire_type, bool* value) {
    uint64_t v = 0;
    if (!Varint(field, wire_type, &v)) return false;
    *value = v != 0;
    return true;
  }
  bool Int32(uint32_t field, int wire_type, int32_t* value) {
    uint64_t v = 0;
    if (!Varint(field, wire_type, &v)) return false;
    // int32 fields are sign-extended to 64 bits on the wire; keep the low half.
    *value = static_cast<int32_t>(static_cast<uint32_t>(v));
    return true;
  }
  bool Float(uint32_t field, int wire_type, float* value) {
    uint32_t bits = 0;
    if (!Expect(field, wire_type, kFixed32) || !r_->ReadFixed32(&bits)) return false;
    *value = std::bit_cast<float>(bits);
    return true;
  }
  bool Bytes(uint32_t field, int wire_type, std::string_view* value, size_t* offset) {
    return Expect(field, wire_type, kLengthDelimited) && r_->ReadBytes(value, offset);
  }
  bool String(uint32_t field, int wire_type, std::string* value) {
    std::string_view bytes;
    size_t offset = 0;
    if (!Bytes(field, wire_type, &bytes, &offset)) return false;
    value->assign(bytes.data(), bytes.size());
    return true;
  }

 private:
  WireReader* r_;
};

// Reads the fields of one message from `bytes`, handing each to
// `on_field(reader, parser, field, wire_type)`, which returns false on a bad
// field (after reader.Fail, or a parser call that failed). False, with the
// reader's error in *error, when the message is malformed.
template <typename OnField>
bool ParseFields(std::string_view bytes, size_t base, std::string* error, OnField on_field) {
  WireReader r(bytes, base);
  MessageParser p(&r);
  while (!r.AtEnd()) {
    uint32_t field = 0;
    int wt = 0;
    if (!r.ReadTag(&field, &wt) || !on_field(r, p, field, wt)) break;
  }
  *error = r.error();
  return error->empty();
}

bool ParsePiece(std::string_view bytes, size_t base, SentencePieceModelProto::Piece* piece, std::string* error) {
  return ParseFields(bytes, base, error, [piece](WireReader& r, MessageParser& p, uint32_t field, int wt) {
    switch (field) {
      case 1:
        return p.String(field, wt, &piece->piece);
      case 2:
        return p.Float(field, wt, &piece->score);
      case 3: {
        int32_t type = 0;
        if (!p.Int32(field, wt, &type)) return false;
        if (type < 1 || type > 6) return r.Fail(absl::StrCat("unknown piece type ", type));
        piece->type = static_cast<PieceType>(type);
        return true;
      }
      default:
        return r.Skip(field, wt);
    }
  });
}

bool ParseTrainerSpec(std::string_view bytes, size_t base, SentencePieceModelProto* m, std::string* error) {
  return ParseFields(bytes, base, error, [m](WireReader& r, MessageParser& p, uint32_t field, int wt) {
    switch (field) {
      case 3: {
        int32_t type = 0;
        if (!p.Int32(field, wt, &type)) return false;
        if (type < 1 || type > 4) return r.Fail(absl::StrCat("unknown model_type ", type));
        m->model_type = static_cast<ModelType>(type);
        return true;
      }
      case 24:
        return p.Bool(field, wt, &m->treat_whitespace_as_suffix);
      case 35:
        return p.Bool(field, wt, &m->byte_fallback);
      case 40:
        return p.Int32(field, wt, &m->unk_id);
      case 41:
        return p.Int32(field, wt, &m->bos_id);
      case 42:
        return p.Int32(field, wt, &m->eos_id);
      case 43:
        return p.Int32(field, wt, &m->pad_id);
      case 44:
        return p.String(field, wt, &m->unk_surface);
      case 45:
        return p.String(field, wt, &m->unk_piece);
      case 46:
        return p.String(field, wt, &m->bos_piece);
      case 47:
        return p.String(field, wt, &m->eos_piece);
      case 48:
        return p.String(field, wt, &m->pad_piece);
      default:
        return r.Skip(field, wt);
    }
  });
}

bool ParseNormalizerSpec(std::string_view bytes, size_t base, SentencePieceModelProto* m, std::string* error) {
  return ParseFields(bytes, base, error, [m](WireReader& r, MessageParser& p, uint32_t field, int wt) {
    switch (field) {
      case 1:
        return p.String(field, wt, &m->normalizer_name);
      case 2:
        return p.String(field, wt, &m->precompiled_charsmap);
      case 3:
        return p.Bool(field, wt, &m->add_dummy_prefix);
      case 4:
        return p.Bool(field, wt, &m->remove_extra_whitespaces);
      case 5:
        return p.Bool(field, wt, &m->escape_whitespaces);
      default:
        return r.Skip(field, wt);
    }
  });
}

}  // namespace

absl::StatusOr<SentencePieceModelProto> ParseSentencePieceModelProto(std::string_view bytes,
                                                                     const std::string& source) {
  SentencePieceModelProto model;
  WireReader r(bytes, 0);
  MessageParser p(&r);
  std::string error;
  bool ok = true;
  while (ok && !r.AtEnd()) {
    uint32_t field = 0;
    int wt = 0;
    if (!r.ReadTag(&field, &wt)) break;
    std::string_view sub;
    size_t offset = 0;
    switch (field) {
      case 1:
        ok = p.Bytes(field, wt, &sub, &offset);
        if (ok) {
          model.pieces.emplace_back();
          ok = ParsePiece(sub, offset, &model.pieces.back(), &error);
        }
        break;
      case 2:
        ok = p.Bytes(field, wt, &sub, &offset) && ParseTrainerSpec(sub, offset, &model, &error);
        break;
      case 3:
        ok = p.Bytes(field, wt, &sub, &offset) && ParseNormalizerSpec(sub, offset, &model, &error);
        break;
      default:
        ok = r.Skip(field, wt);
    }
  }
  if (error.empty()) error = r.error();
  if (!error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid SentencePiece model: ", error));
  }
  return model;
}

}  // namespace strata::policies
