#include "policies/checkpoint/safetensors.h"

#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kBadName[] = "bad.safetensors";

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

template <typename T>
std::vector<std::byte> BytesOf(std::initializer_list<T> values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

std::string LittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file assembled by hand: length prefix, header, data.
std::string Frame(const std::string& header, const std::string& data = "") {
  return LittleEndian64(header.size()) + header + data;
}

// Tensors to write together with the bytes they point at.
struct OwnedTensors {
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    AddBytes(name, dtype, std::move(shape), RandomBytes(numel * DTypeSize(dtype), seed));
  }
  void AddBytes(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte> bytes) {
    storage.push_back(std::make_unique<std::vector<std::byte>>(std::move(bytes)));
    tensors.push_back({name, dtype, std::move(shape), *storage.back()});
  }
  std::vector<std::unique_ptr<std::vector<std::byte>>> storage;
  std::vector<TensorToWrite> tensors;
};

void ExpectSameTensor(const TensorToWrite& want, const TensorView& got) {
  SCOPED_TRACE(want.name);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_TRUE(SameBytes(got.data, want.data));
  EXPECT_EQ(static_cast<size_t>(got.numel()) * DTypeSize(got.dtype), got.data.size());
}

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::vector<std::string>& needles) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& needle : needles) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(needle));
  }
}

// Writes `contents` byte for byte as bad.safetensors and opens it.
absl::Status OpenRaw(const testing::TempDir& dir, const std::string& contents) {
  testing::WriteTextFile(dir.Join(kBadName), contents);
  return SafetensorsFile::Open(dir.Join(kBadName)).status();
}

// Opens a hand-made header that must be rejected naming the file and `tensor`.
void ExpectHeaderRejected(const std::string& header, const std::string& data, const std::string& tensor) {
  testing::TempDir dir;
  std::vector<std::string> needles = {dir.Join(kBadName)};
  if (!tensor.empty()) needles.push_back("'" + tensor + "'");
  ExpectError(OpenRaw(dir, Frame(header, data)), absl::StatusCode::kInvalidArgument, needles);
}

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

TEST(SafetensorsTest, DTypeNamesRoundTripAndSizesMatchTheFormat) {
  const std::vector<std::pair<DType, size_t>> all = {{DType::kF64, 8},  {DType::kF32, 4}, {DType::kF16, 2},
                                                     {DType::kBF16, 2}, {DType::kI64, 8}, {DType::kI32, 4},
                                                     {DType::kI16, 2},  {DType::kI8, 1},  {DType::kU8, 1},
                                                     {DType::kBool, 1}};
  for (const auto& [dtype, size] : all) {
    const std::string name(DTypeName(dtype));
    auto parsed = ParseDType(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, dtype);
    EXPECT_EQ(DTypeSize(dtype), size) << name;
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kBool), "BOOL");
  ExpectError(ParseDType("F8_E4M3").status(), absl::StatusCode::kInvalidArgument, {"F8_E4M3"});
}

TEST(SafetensorsTest, RoundTripIsBitExactForEveryDType) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("f64", DType::kF64, {3, 2}, 1);
  in.Add("f32", DType::kF32, {4, 5}, 2);
  in.Add("f16", DType::kF16, {7}, 3);
  in.Add("bf16", DType::kBF16, {2, 3, 2}, 4);
  in.Add("i64", DType::kI64, {5}, 5);
  in.Add("i32", DType::kI32, {1, 3}, 6);
  in.Add("i16", DType::kI16, {9}, 7);
  in.Add("i8", DType::kI8, {11}, 8);
  in.Add("u8", DType::kU8, {13}, 9);
  in.Add("bool", DType::kBool, {3}, 10);
  // NaN payloads and signed zeros must survive untouched.
  in.AddBytes("nan.f32", DType::kF32, {3}, BytesOf<uint32_t>({0x7fc00001u, 0xffbfffffu, 0x80000000u}));
  const std::string path = dir.Join("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in.tensors).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), in.tensors.size());
  for (const TensorToWrite& want : in.tensors) {
    const TensorView* got = (*file)->Find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    ExpectSameTensor(want, *got);
  }
  EXPECT_EQ((*file)->Find("absent"), nullptr);
  EXPECT_EQ((*file)->path(), path);
}

TEST(SafetensorsTest, RoundTripKeepsScalarsAndZeroSizeTensors) {
  testing::TempDir dir;
  OwnedTensors in;
  in.AddBytes("scalar", DType::kF32, {}, BytesOf<float>({2.5f}));
  in.AddBytes("empty", DType::kI64, {0}, {});
  in.AddBytes("empty2d", DType::kF16, {3, 0}, {});
  in.AddBytes("after", DType::kI32, {2}, BytesOf<int32_t>({-1, 7}));
  const std::string path = dir.Join("edge.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in.tensors).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const TensorToWrite& want : in.tensors) {
    const TensorView* got = (*file)->Find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    ExpectSameTensor(want, *got);
  }
  EXPECT_EQ((*file)->Find("scalar")->numel(), 1);
  EXPECT_TRUE((*file)->Find("scalar")->shape.empty());
  EXPECT_EQ((*file)->Find("empty2d")->numel(), 0);
}

TEST(SafetensorsTest, MetadataIsPreserved) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("w", DType::kF32, {2}, 1);
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"step", "1200"},
                                                       {"note", "quotes \" and \\ and \xc3\xa9"}};
  const std::string path = dir.Join("meta.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in.tensors, metadata).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), metadata);

  // Without metadata the header carries no "__metadata__" entry at all.
  const std::string bare = dir.Join("bare.safetensors");
  ASSERT_TRUE(WriteSafetensors(bare, in.tensors).ok());
  auto text = ReadFileToString(bare);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->find("__metadata__"), std::string::npos);
}

TEST(SafetensorsTest, HeaderIsSpacePaddedSoDataStartsEightByteAligned) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("odd_name_x", DType::kU8, {3}, 1);
  const std::string path = dir.Join("pad.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in.tensors).ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  ASSERT_GE(text->size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, text->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(text->size(), 8 + n + 3);
  const std::string header = text->substr(8, n);
  const size_t close = header.rfind('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
  EXPECT_TRUE(Json::accept(header));
}

TEST(SafetensorsTest, TensorsAreListedInDataOffsetOrderAndViewTheMapping) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("zeta", DType::kF32, {4}, 1);
  in.Add("alpha", DType::kI64, {2}, 2);
  in.Add("mid", DType::kU8, {5}, 3);
  const std::string path = dir.Join("order.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in.tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const auto& tensors = (*file)->tensors();
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_EQ(tensors[0].name, "zeta");
  EXPECT_EQ(tensors[1].name, "alpha");
  EXPECT_EQ(tensors[2].name, "mid");
  // Views into one mapping sit back to back; copies would not.
  EXPECT_EQ(tensors[0].data.data() + tensors[0].data.size(), tensors[1].data.data());
  EXPECT_EQ(tensors[1].data.data() + tensors[1].data.size(), tensors[2].data.data());
}

TEST(SafetensorsTest, WriteRejectsDataSizeThatDisagreesWithShape) {
  testing::TempDir dir;
  OwnedTensors in;
  in.AddBytes("short.weight", DType::kF32, {2, 2}, RandomBytes(12, 1));
  const std::string path = dir.Join("w.safetensors");
  ExpectError(WriteSafetensors(path, in.tensors), absl::StatusCode::kInvalidArgument,
              {path, "'short.weight'", "16", "12"});
  EXPECT_FALSE(IsRegularFile(path));
}

TEST(SafetensorsTest, WriteRejectsDuplicateReservedAndNegativeShapes) {
  testing::TempDir dir;
  const std::string path = dir.Join("w.safetensors");
  OwnedTensors dup;
  dup.Add("same", DType::kU8, {1}, 1);
  dup.Add("same", DType::kU8, {1}, 2);
  ExpectError(WriteSafetensors(path, dup.tensors), absl::StatusCode::kInvalidArgument, {"'same'", "duplicate"});
  OwnedTensors reserved;
  reserved.Add("__metadata__", DType::kU8, {1}, 1);
  ExpectError(WriteSafetensors(path, reserved.tensors), absl::StatusCode::kInvalidArgument, {"__metadata__"});
  OwnedTensors negative;
  negative.AddBytes("neg", DType::kU8, {-1}, {});
  ExpectError(WriteSafetensors(path, negative.tensors), absl::StatusCode::kInvalidArgument, {"'neg'", "negative"});
  EXPECT_FALSE(IsRegularFile(path));
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  testing::TempDir dir;
  const std::string path = dir.Join("nope.safetensors");
  ExpectError(SafetensorsFile::Open(path).status(), absl::StatusCode::kNotFound, {path});
}

TEST(SafetensorsTest, FileShorterThanEightBytesIsRejected) {
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, std::string("\x02\0\0\0", 4)), absl::StatusCode::kInvalidArgument,
              {dir.Join(kBadName), "too short"});
  ExpectError(OpenRaw(dir, ""), absl::StatusCode::kInvalidArgument, {dir.Join(kBadName)});
}

TEST(SafetensorsTest, HeaderLengthPastEndOfFileIsRejected) {
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, LittleEndian64(1000) + "{}"), absl::StatusCode::kInvalidArgument,
              {dir.Join(kBadName), "1000", "past the end"});
}

TEST(SafetensorsTest, AbsurdHeaderLengthIsRejectedWithoutOverflow) {
  testing::TempDir dir;
  // 2^64 - 4 would wrap around if added to 8 before comparing.
  for (uint64_t n : {~uint64_t{0} - 3, uint64_t{1} << 40, uint64_t{200'000'000}}) {
    SCOPED_TRACE(n);
    ExpectError(OpenRaw(dir, LittleEndian64(n) + "{}"), absl::StatusCode::kInvalidArgument,
                {dir.Join(kBadName), "header length"});
  }
}

TEST(SafetensorsTest, HeaderThatIsNotJsonIsRejected) {
  ExpectHeaderRejected("{\"a\": {\"dtype\": ", "", "");
  ExpectHeaderRejected("", "", "");
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, Frame("not json at all")), absl::StatusCode::kInvalidArgument,
              {dir.Join(kBadName), "not valid JSON"});
}

TEST(SafetensorsTest, HeaderThatIsNotAnObjectIsRejected) {
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, Frame("[1, 2, 3]")), absl::StatusCode::kInvalidArgument, {dir.Join(kBadName), "object"});
}

TEST(SafetensorsTest, EntryMissingAFieldIsRejected) {
  const std::string data(8, '\0');
  ExpectHeaderRejected(R"({"w.a": {"shape": [2], "data_offsets": [0, 8]}})", data, "w.a");
  ExpectHeaderRejected(R"({"w.b": {"dtype": "F32", "data_offsets": [0, 8]}})", data, "w.b");
  ExpectHeaderRejected(R"({"w.c": {"dtype": "F32", "shape": [2]}})", data, "w.c");
}

TEST(SafetensorsTest, EntryWithWrongTypesIsRejected) {
  const std::string data(8, '\0');
  ExpectHeaderRejected(R"({"t1": [1, 2]})", data, "t1");
  ExpectHeaderRejected(R"({"t2": {"dtype": 32, "shape": [2], "data_offsets": [0, 8]}})", data, "t2");
  ExpectHeaderRejected(R"({"t3": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", data, "t3");
  ExpectHeaderRejected(R"({"t4": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", data, "t4");
  ExpectHeaderRejected(R"({"t5": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", data, "t5");
  ExpectHeaderRejected(R"({"t6": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}})", data, "t6");
  ExpectHeaderRejected(R"({"t7": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", data, "t7");
  ExpectHeaderRejected(R"({"t8": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"k": 1}})",
                       data, "");
}

TEST(SafetensorsTest, UnknownDTypeIsRejected) {
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, Frame(R"({"q.weight": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 1]}})",
                                 std::string(1, '\0'))),
              absl::StatusCode::kInvalidArgument, {dir.Join(kBadName), "'q.weight'", "Q4_K"});
}

TEST(SafetensorsTest, NegativeDimensionIsRejected) {
  ExpectHeaderRejected(R"({"neg.dim": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})", "", "neg.dim");
}

TEST(SafetensorsTest, BeginAfterEndIsRejected) {
  ExpectHeaderRejected(R"({"rev": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", std::string(8, '\0'),
                       "rev");
}

TEST(SafetensorsTest, OffsetsOutsideTheDataBufferAreRejected) {
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, Frame(R"({"far": {"dtype": "F32", "shape": [2], "data_offsets": [100, 108]}})",
                                 std::string(8, '\0'))),
              absl::StatusCode::kInvalidArgument, {dir.Join(kBadName), "'far'", "[100, 108]"});
}

TEST(SafetensorsTest, ShapeThatDisagreesWithOffsetsIsRejected) {
  testing::TempDir dir;
  ExpectError(OpenRaw(dir, Frame(R"({"mis": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
                                 std::string(16, '\0'))),
              absl::StatusCode::kInvalidArgument, {dir.Join(kBadName), "'mis'", "16", "12"});
}

TEST(SafetensorsTest, OverlappingTensorsAreRejected) {
  testing::TempDir dir;
  const std::string header = R"({"first": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "second": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  ExpectError(OpenRaw(dir, Frame(header, std::string(12, '\0'))), absl::StatusCode::kInvalidArgument,
              {dir.Join(kBadName), "'first'", "'second'", "overlap"});
  // The overlap is caught even when the later entry sits wholly inside an
  // earlier, longer one.
  const std::string nested = R"({"outer": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
      "inner": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})";
  ExpectError(OpenRaw(dir, Frame(nested, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              {"'outer'", "'inner'", "overlap"});
}

TEST(SafetensorsTest, ZeroSizeTensorInsideAnotherIsNotAnOverlap) {
  testing::TempDir dir;
  const std::string header = R"({"full": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
      "none": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]}})";
  EXPECT_TRUE(OpenRaw(dir, Frame(header, std::string(8, '\0'))).ok());
}

TEST(SafetensorsTest, TruncatedFileIsRejected) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("head", DType::kF32, {4}, 1);
  in.Add("tail.weight", DType::kF32, {4}, 2);
  const std::string good = dir.Join("good.safetensors");
  ASSERT_TRUE(WriteSafetensors(good, in.tensors).ok());
  auto bytes = ReadFileToString(good);
  ASSERT_TRUE(bytes.ok());
  ExpectError(OpenRaw(dir, bytes->substr(0, bytes->size() - 3)), absl::StatusCode::kInvalidArgument,
              {dir.Join(kBadName), "'tail.weight'", "truncated"});
}

TEST(SafetensorsTest, ShapeWhoseSizeOverflowsIsRejected) {
  // 2^40 cubed overflows 64 bits; a naive product would wrap to a small size.
  ExpectHeaderRejected(
      R"({"huge": {"dtype": "F64", "shape": [1099511627776, 1099511627776, 1099511627776],
          "data_offsets": [0, 0]}})",
      "", "huge");
  ExpectHeaderRejected(R"({"wraps": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", "",
                       "wraps");
  ExpectHeaderRejected(R"({"big": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", "",
                       "big");
}

TEST(SafetensorsTest, ReadsFileWrittenByAnIndependentPythonWriter) {
  const std::string python = testing::ReferencePython();
  if (!testing::HaveProgram(python)) GTEST_SKIP() << python << " is not installed";
  testing::TempDir dir;
  const std::string path = dir.Join("py.safetensors");
  // No padding and tensors at odd offsets: legal, and not what our writer makes.
  const std::string script = R"py(
import json, struct, sys
import numpy as np
tensors = [
    ("half.f16", "F16", np.array([1.5, -2.0, 65504.0, 0.0], dtype="<f2")),
    ("bytes.u8", "U8", np.arange(5, dtype=np.uint8)),
    ("weights.f32", "F32", (np.arange(6, dtype="<f4").reshape(2, 3) * np.float32(0.5) - np.float32(1))),
    ("ids.i64", "I64", np.array([-3, 0, 1 << 40], dtype="<i8")),
    ("mask.bool", "BOOL", np.array([[True, False], [False, True]])),
    ("scalar.f64", "F64", np.array(3.25, dtype="<f8")),
    ("empty.i32", "I32", np.zeros((0, 4), dtype="<i4")),
    ("bf.bf16", "BF16", np.array([0x3F80, 0xC000], dtype="<u2")),
]
header = {"__metadata__": {"format": "np"}}
data = b""
for name, dtype, arr in tensors:
    raw = np.ascontiguousarray(arr).tobytes()
    header[name] = {"dtype": dtype, "shape": list(arr.shape),
                    "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
h = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
)py";
  auto run = testing::RunCommand({python, "-c", script, path});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0);

  auto ckpt = Checkpoint::Open(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), (std::vector<std::string>{"bf.bf16", "bytes.u8", "empty.i32", "half.f16", "ids.i64",
                                                        "mask.bool", "scalar.f64", "weights.f32"}));
  auto expect = [&](const std::string& name, DType dtype, std::vector<int64_t> shape,
                    const std::vector<std::byte>& bytes) {
    SCOPED_TRACE(name);
    auto t = (*ckpt)->Get(name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, shape);
    EXPECT_TRUE(SameBytes(t->data, bytes));
  };
  expect("half.f16", DType::kF16, {4}, BytesOf<uint16_t>({0x3E00, 0xC000, 0x7BFF, 0x0000}));
  expect("bytes.u8", DType::kU8, {5}, BytesOf<uint8_t>({0, 1, 2, 3, 4}));
  expect("weights.f32", DType::kF32, {2, 3}, BytesOf<float>({-1.f, -0.5f, 0.f, 0.5f, 1.f, 1.5f}));
  expect("ids.i64", DType::kI64, {3}, BytesOf<int64_t>({-3, 0, int64_t{1} << 40}));
  expect("mask.bool", DType::kBool, {2, 2}, BytesOf<uint8_t>({1, 0, 0, 1}));
  expect("scalar.f64", DType::kF64, {}, BytesOf<double>({3.25}));
  expect("empty.i32", DType::kI32, {0, 4}, {});
  expect("bf.bf16", DType::kBF16, {2}, BytesOf<uint16_t>({0x3F80, 0xC000}));
}

TEST(SafetensorsTest, IndependentPythonReaderAcceptsOurFiles) {
  const std::string python = testing::ReferencePython();
  if (!testing::HaveProgram(python)) GTEST_SKIP() << python << " is not installed";
  testing::TempDir dir;
  OwnedTensors in;
  in.AddBytes("a.f32", DType::kF32, {2}, BytesOf<float>({0.5f, -1.25f}));
  in.AddBytes("b.u8", DType::kU8, {3}, BytesOf<uint8_t>({7, 8, 9}));
  in.AddBytes("c.i64", DType::kI64, {}, BytesOf<int64_t>({-(int64_t{1} << 40)}));
  in.AddBytes("d.f16", DType::kF16, {0, 2}, {});
  in.AddBytes("e.i16", DType::kI16, {1, 2}, BytesOf<int16_t>({-300, 300}));
  const std::string path = dir.Join("ours.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in.tensors, {{"format", "pt"}}).ok());
  // Checks what the reference (Rust) reader insists on: an 8-aligned data
  // start and a data buffer covered exactly, with no gaps.
  const std::string script = R"py(
import json, struct, sys
import numpy as np
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
assert (8 + n) % 8 == 0, n
h = json.loads(b[8:8 + n])
out = {"__metadata__": h.pop("__metadata__", {})}
dt = {"F32": "<f4", "U8": "u1", "I64": "<i8", "F16": "<f2", "I16": "<i2"}
pos = 0
for name, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"]):
    s, e = v["data_offsets"]
    assert s == pos, (name, s, pos)
    pos = e
    a = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt[v["dtype"]]).reshape(v["shape"])
    out[name] = [v["dtype"], list(v["shape"]), a.ravel().tolist()]
assert pos == len(b) - 8 - n, (pos, len(b) - 8 - n)
print(json.dumps(out))
)py";
  auto run = testing::RunCommand({python, "-c", script, path});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->output;
  const Json got = Json::parse(run->output);
  const Json want = Json::parse(R"({
      "__metadata__": {"format": "pt"},
      "a.f32": ["F32", [2], [0.5, -1.25]],
      "b.u8": ["U8", [3], [7, 8, 9]],
      "c.i64": ["I64", [], [-1099511627776]],
      "d.f16": ["F16", [0, 2], []],
      "e.i16": ["I16", [1, 2], [-300, 300]]})");
  EXPECT_EQ(got, want) << got.dump();
}

// Seven tensors whose greedy packing into 80-byte shards is worked out by
// hand in ShardedWriteReadsBackBitExactWithTheRightWeightMap.
OwnedTensors ShardingInput() {
  OwnedTensors in;
  in.Add("a", DType::kF32, {4, 4}, 1);   // 64 bytes
  in.Add("b", DType::kF16, {8}, 2);      // 16
  in.Add("c", DType::kI64, {3}, 3);      // 24
  in.Add("d", DType::kU8, {100}, 4);     // 100, over the limit on its own
  in.Add("e", DType::kBF16, {2, 3}, 5);  // 12
  in.Add("f", DType::kF32, {}, 6);       // 4
  in.Add("g", DType::kF32, {0}, 7);      // 0
  return in;
}

TEST(CheckpointTest, SmallCheckpointIsWrittenAsOneFile) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, /*max_shard_bytes=*/1 << 20).ok());
  EXPECT_EQ(ListDir(dir.path()), (std::set<std::string>{"model.safetensors"}));
  auto file = SafetensorsFile::Open(dir.Join("model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (const TensorToWrite& want : in.tensors) {
    auto got = (*ckpt)->Get(want.name);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameTensor(want, *got);
  }
}

TEST(CheckpointTest, ShardedWriteReadsBackBitExactWithTheRightWeightMap) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, /*max_shard_bytes=*/80).ok());
  EXPECT_EQ(ListDir(dir.path()),
            (std::set<std::string>{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                   "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                                   "model.safetensors.index.json"}));

  auto text = ReadFileToString(dir.Join("model.safetensors.index.json"));
  ASSERT_TRUE(text.ok());
  const Json index = Json::parse(*text);
  EXPECT_EQ(index["metadata"]["total_size"], 220);
  const Json want_map = {{"a", "model-00001-of-00004.safetensors"}, {"b", "model-00001-of-00004.safetensors"},
                         {"c", "model-00002-of-00004.safetensors"}, {"d", "model-00003-of-00004.safetensors"},
                         {"e", "model-00004-of-00004.safetensors"}, {"f", "model-00004-of-00004.safetensors"},
                         {"g", "model-00004-of-00004.safetensors"}};
  EXPECT_EQ(index["weight_map"], want_map) << index.dump();

  auto shard = SafetensorsFile::Open(dir.Join("model-00004-of-00004.safetensors"));
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->metadata().at("format"), "pt");
  EXPECT_EQ((*shard)->tensors().size(), 3u);

  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), (std::vector<std::string>{"a", "b", "c", "d", "e", "f", "g"}));
  for (const TensorToWrite& want : in.tensors) {
    EXPECT_TRUE((*ckpt)->Has(want.name));
    auto got = (*ckpt)->Get(want.name);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameTensor(want, *got);
  }
}

TEST(CheckpointTest, ShardSharedByManyTensorsIsMappedOnce) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, 80).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto a = (*ckpt)->Get("a");
  auto b = (*ckpt)->Get("b");
  ASSERT_TRUE(a.ok() && b.ok());
  // Two mappings of the same shard would put "b" somewhere other than
  // right after "a".
  EXPECT_EQ(a->data.data() + a->data.size(), b->data.data());
}

TEST(CheckpointTest, RewritingAsOneFileRemovesTheStaleIndexAndShards) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  testing::WriteTextFile(dir.Join("config.json"), "{}");
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, 80).ok());
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors).ok());
  EXPECT_EQ(ListDir(dir.path()), (std::set<std::string>{"config.json", "model.safetensors"}));
}

TEST(CheckpointTest, RewritingShardedRemovesTheStaleFileAndUnlistedShards) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors).ok());
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, 80).ok());
  EXPECT_FALSE(IsRegularFile(dir.Join("model.safetensors")));
  // Fewer, larger shards: the four old ones must not linger.
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, 128).ok());
  EXPECT_EQ(ListDir(dir.path()),
            (std::set<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                   "model.safetensors.index.json"}));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names().size(), in.tensors.size());
}

TEST(CheckpointTest, WriteCreatesTheDirectoryAndRejectsDuplicatesAcrossShards) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("x", DType::kF32, {16}, 1);
  in.Add("x", DType::kF32, {16}, 2);
  const std::string out = dir.Join("new_ckpt");
  ExpectError(WriteCheckpoint(out, in.tensors, 64), absl::StatusCode::kInvalidArgument, {out, "'x'", "duplicate"});
  EXPECT_FALSE(IsDirectory(out));
  OwnedTensors ok = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(out, ok.tensors, 80).ok());
  EXPECT_TRUE(IsRegularFile(JoinPath(out, "model.safetensors.index.json")));
}

TEST(CheckpointTest, OpensAFileOrIndexPathDirectly) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteSafetensors(dir.Join("single.safetensors"), in.tensors).ok());
  auto single = Checkpoint::Open(dir.Join("single.safetensors"));
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ((*single)->Names().size(), in.tensors.size());

  const std::string sharded = dir.Join("sharded");
  ASSERT_TRUE(WriteCheckpoint(sharded, in.tensors, 80).ok());
  auto index = Checkpoint::Open(JoinPath(sharded, "model.safetensors.index.json"));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->Names().size(), in.tensors.size());
}

TEST(CheckpointTest, GetOfMissingTensorNamesTheTensorAndDirectory) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, 80).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE((*ckpt)->Has("lm_head.weight"));
  ExpectError((*ckpt)->Get("lm_head.weight").status(), absl::StatusCode::kNotFound, {"lm_head.weight", dir.path()});
}

TEST(CheckpointTest, MissingShardIsNotFoundNamingTheShardAndIndex) {
  testing::TempDir dir;
  OwnedTensors in = ShardingInput();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), in.tensors, 80).ok());
  ASSERT_TRUE(std::filesystem::remove(dir.Join("model-00002-of-00004.safetensors")));
  ExpectError(Checkpoint::Open(dir.path()).status(), absl::StatusCode::kNotFound,
              {"model-00002-of-00004.safetensors", "model.safetensors.index.json"});
}

TEST(CheckpointTest, TensorListedInIndexButAbsentFromShardIsRejected) {
  testing::TempDir dir;
  OwnedTensors in;
  in.Add("present", DType::kF32, {2}, 1);
  ASSERT_TRUE(WriteSafetensors(dir.Join("shard.safetensors"), in.tensors).ok());
  testing::WriteTextFile(dir.Join("model.safetensors.index.json"),
                         R"({"metadata": {"total_size": 8}, "weight_map": {
                             "present": "shard.safetensors",
                             "ghost.weight": "shard.safetensors"}})");
  ExpectError(Checkpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
              {"'ghost.weight'", "shard.safetensors", "model.safetensors.index.json"});
}

TEST(CheckpointTest, MalformedIndexIsRejectedNamingTheIndex) {
  testing::TempDir dir;
  const std::string index = dir.Join("model.safetensors.index.json");
  for (const std::string& text :
       {std::string("{\"weight_map\": {"), std::string("{\"metadata\": {}}"), std::string("{\"weight_map\": [\"a\"]}"),
        std::string("[]"), std::string("{\"weight_map\": {\"a\": 3}}")}) {
    SCOPED_TRACE(text);
    testing::WriteTextFile(index, text);
    ExpectError(Checkpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument, {index});
  }
}

TEST(CheckpointTest, ShardPathEscapingTheDirectoryIsRejected) {
  testing::TempDir dir;
  testing::WriteTextFile(dir.Join("model.safetensors.index.json"),
                         R"({"weight_map": {"w": "../elsewhere.safetensors"}})");
  ExpectError(Checkpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
              {"'w'", "../elsewhere.safetensors"});
}

TEST(CheckpointTest, MalformedShardErrorNamesTheShardAndTensor) {
  testing::TempDir dir;
  testing::WriteTextFile(dir.Join("model-00001-of-00001.safetensors"),
                         Frame(R"({"bad.w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                               std::string(8, '\0')));
  testing::WriteTextFile(dir.Join("model.safetensors.index.json"),
                         R"({"weight_map": {"bad.w": "model-00001-of-00001.safetensors"}})");
  ExpectError(Checkpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
              {dir.Join("model-00001-of-00001.safetensors"), "'bad.w'"});
}

TEST(CheckpointTest, DirectoryWithoutCheckpointIsNotFound) {
  testing::TempDir dir;
  ExpectError(Checkpoint::Open(dir.path()).status(), absl::StatusCode::kNotFound, {dir.path(), "model.safetensors"});
  ExpectError(Checkpoint::Open(dir.Join("absent")).status(), absl::StatusCode::kNotFound, {dir.Join("absent")});
}

}  // namespace
}  // namespace strata::policies
