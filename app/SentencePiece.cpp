#include "app/SentencePiece.h"

#include "app/SentencePiecePlugin.h"
#include "support/Error.h"
#include "support/Unicode.h"

#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Regex.h"

#include <cstdlib>
#include <fmt/format.h>
#include <mutex>

namespace tgc {

namespace {

constexpr const char *kPluginName = "libtgc_sentencepiece.so";

/// The plugin's entry points, opened once.
struct Plugin {
  decltype(&tgc_spm_abi) abi = nullptr;
  decltype(&tgc_spm_load) load = nullptr;
  decltype(&tgc_spm_unload) unload = nullptr;
  decltype(&tgc_spm_vocab) vocab = nullptr;
  decltype(&tgc_spm_encode) encode = nullptr;
  decltype(&tgc_spm_decode) decode = nullptr;
  decltype(&tgc_spm_train) train = nullptr;
  decltype(&tgc_spm_release) release = nullptr;
  std::string missing; // why it could not be opened, if it could not
};

/// Where the plugin may be: $TGC_SENTENCEPIECE_PLUGIN, else the build's lib folder (the path this
/// build wrote it to), else lib/ beside the folder of the running program (a build folder carried
/// elsewhere).
std::vector<std::string> pluginCandidates() {
  if (const char *given = std::getenv("TGC_SENTENCEPIECE_PLUGIN"); given && *given)
    return {given};
  std::vector<std::string> candidates;
#ifdef TGC_PLUGIN_DIR
  candidates.push_back(std::string(TGC_PLUGIN_DIR) + "/" + kPluginName);
#endif
  static int anchor;
  std::string self = llvm::sys::fs::getMainExecutable(nullptr, &anchor);
  if (!self.empty()) {
    llvm::SmallString<256> path(llvm::sys::path::parent_path(llvm::sys::path::parent_path(self)));
    llvm::sys::path::append(path, "lib", kPluginName);
    candidates.push_back(path.str().str());
  }
  return candidates;
}

const Plugin &plugin() {
  static Plugin p;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    for (const std::string &path : pluginCandidates()) {
      if (!llvm::sys::fs::exists(path)) {
        tried.push_back(path + " (not there)");
        continue;
      }
      std::string error;
      auto library = llvm::sys::DynamicLibrary::getPermanentLibrary(path.c_str(), &error);
      if (!library.isValid()) { // e.g. libsentencepiece.so.0 missing on this machine
        tried.push_back(path + ": " + error);
        continue;
      }
      auto symbol = [&](auto &entry, const char *name) {
        entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(library.getAddressOfSymbol(name));
        return entry != nullptr;
      };
      if (!(symbol(p.abi, "tgc_spm_abi") && symbol(p.load, "tgc_spm_load") && symbol(p.unload, "tgc_spm_unload") &&
            symbol(p.vocab, "tgc_spm_vocab") && symbol(p.encode, "tgc_spm_encode") &&
            symbol(p.decode, "tgc_spm_decode") && symbol(p.train, "tgc_spm_train") &&
            symbol(p.release, "tgc_spm_release")) ||
          p.abi() != TGC_SPM_ABI) {
        tried.push_back(path + ": not this tgc's plugin (another interface)");
        p = Plugin{};
        continue;
      }
      return;
    }
    p.missing = fmt::format("SentencePiece is not available: tgc reaches it through its plugin {}, built where "
                            "Debian's libsentencepiece-dev is installed (scripts/setup.sh installs it) and run "
                            "where libsentencepiece0 is; tried {}",
                            kPluginName, tried.empty() ? "nothing" : llvm::join(tried, "; "));
  });
  return p;
}

class SentencePieceTokenizer : public Tokenizer {
public:
  explicit SentencePieceTokenizer(void *model) : model_(model), vocab_(plugin().vocab(model)) {}
  ~SentencePieceTokenizer() override { plugin().unload(model_); }

  llvm::Expected<std::vector<int32_t>> encode(llvm::StringRef text) const override {
    if (auto cps = decodeUtf8(text); !cps)
      return cps.takeError();
    int *ids = nullptr;
    size_t count = 0;
    char error[512];
    if (!plugin().encode(model_, text.data(), text.size(), &ids, &count, error, sizeof error))
      return stringError(fmt::format("SentencePiece: {}", error));
    std::vector<int32_t> out(ids, ids + count);
    plugin().release(ids);
    return out;
  }

  llvm::Expected<std::string> decode(llvm::ArrayRef<int32_t> ids) const override {
    for (int32_t id : ids)
      if (id < 0 || id >= vocabSize())
        return stringError(fmt::format("token {} is outside the tokenizer's {} ids", id, vocabSize()));
    std::vector<int> in(ids.begin(), ids.end());
    char *text = nullptr, error[512];
    size_t size = 0;
    if (!plugin().decode(model_, in.data(), in.size(), &text, &size, error, sizeof error))
      return stringError(fmt::format("SentencePiece: {}", error));
    std::string out(text, size);
    plugin().release(text);
    return out;
  }

  int64_t vocabSize() const override { return vocab_; }
  std::string describe() const override { return fmt::format("SentencePiece, {} pieces", vocabSize()); }

private:
  void *model_;
  int64_t vocab_; // (the model's piece count, fixed once loaded)
};

} // namespace

llvm::Error sentencePieceAvailable() {
  const Plugin &p = plugin();
  return p.missing.empty() ? llvm::Error::success() : stringError(p.missing);
}

llvm::Expected<std::unique_ptr<Tokenizer>> parseSentencePiece(llvm::StringRef bytes, llvm::StringRef path) {
  if (auto err = sentencePieceAvailable())
    return stringError(fmt::format("{}: error: not a tokenizer.json, and no SentencePiece to read it as a .model "
                                   "file: {}",
                                   path.str(), llvm::toString(std::move(err))));
  char error[512];
  void *model = plugin().load(bytes.data(), bytes.size(), error, sizeof error);
  if (!model)
    return stringError(fmt::format("{}: error: not a tokenizer.json nor a SentencePiece model ({})", path.str(), error));
  return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(model));
}

namespace {
/// SentencePiece's trainer's error in tgc's terms where it is one a user makes (a vocabulary the
/// corpus cannot fill, or too small for its characters); its own words otherwise.
std::string trainerError(llvm::StringRef error, const SentencePieceTraining &training) {
  llvm::SmallVector<llvm::StringRef, 3> m;
  if (llvm::Regex("Vocabulary size too high \\(([0-9]+)\\)[^0-9]*([0-9]+)").match(error, &m))
    return fmt::format("--vocab {}: this corpus makes at most {} pieces (a larger corpus makes more)", m[1].str(),
                       m[2].str());
  if (llvm::Regex("smaller than required_chars\\. ([0-9]+) vs ([0-9]+)").match(error, &m))
    return fmt::format("--vocab {}: the pieces it must hold (the 256 byte pieces, <unk>, <s>, </s>, and each "
                       "character --character-coverage {} keeps) are {} already; give a larger --vocab or a lower "
                       "--character-coverage (the characters left out are spelled in byte pieces)",
                       m[1].str(), training.characterCoverage, m[2].str());
  if (error.contains("!sentences_.empty()"))
    return "no text to train on";
  return "SentencePiece's trainer: " + error.str();
}
} // namespace

llvm::Expected<std::string> trainSentencePiece(llvm::StringRef corpus, const SentencePieceTraining &training) {
  if (auto err = sentencePieceAvailable())
    return std::move(err);
  if (training.modelType != "bpe" && training.modelType != "unigram")
    return stringError(fmt::format("error: --model-type {}: bpe or unigram", training.modelType));
  std::string args;
  for (const std::string &arg :
       {fmt::format("vocab_size={}", training.vocab), "model_type=" + training.modelType,
        fmt::format("character_coverage={}", training.characterCoverage), std::string("normalization_rule_name=identity"),
        std::string("add_dummy_prefix=false"), std::string("remove_extra_whitespaces=false"),
        std::string("split_digits=true"), std::string("byte_fallback=true"), std::string("minloglevel=2")})
    args += arg + '\0';
  char *model = nullptr, error[1024];
  size_t size = 0;
  if (!plugin().train(corpus.str().c_str(), args.data(), args.size(), &model, &size, error, sizeof error))
    return stringError(fmt::format("{}: error: {}", corpus.str(), trainerError(error, training)));
  std::string out(model, size);
  plugin().release(model);
  return out;
}

} // namespace tgc
