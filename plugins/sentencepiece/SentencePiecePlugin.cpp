// libtgc_sentencepiece.so: SentencePiece's processor and trainer behind the C interface of
// SentencePiecePlugin.h. Built where libsentencepiece-dev is installed; tgc opens it at run time.
#include "app/SentencePiecePlugin.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int fail(const std::string &message, char *error, size_t errorSize) {
  if (errorSize) {
    size_t n = std::min(message.size(), errorSize - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 0;
}

/// The corpus's lines, read here and handed to the trainer (rather than its path as the trainer's
/// `input`, which the model would record: the same text at another path would give other bytes).
class LineIterator : public sentencepiece::SentenceIterator {
public:
  explicit LineIterator(const char *path) : in_(path) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !std::getline(in_, line_); }
  const std::string &value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (!in_.is_open() || in_.bad())
      return sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound, "cannot read the corpus");
    return sentencepiece::util::Status();
  }

private:
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
};

template <typename T> T *copyOut(const T *data, size_t count) {
  T *out = static_cast<T *>(std::malloc(std::max<size_t>(count, 1) * sizeof(T)));
  if (out && count)
    std::memcpy(out, data, count * sizeof(T));
  return out;
}

} // namespace

extern "C" {

int tgc_spm_abi(void) { return TGC_SPM_ABI; }

void *tgc_spm_load(const char *bytes, size_t size, char *error, size_t errorSize) {
  auto *model = new sentencepiece::SentencePieceProcessor();
  auto status = model->LoadFromSerializedProto(std::string_view(bytes, size));
  if (!status.ok()) {
    fail(status.ToString(), error, errorSize);
    delete model;
    return nullptr;
  }
  return model;
}

void tgc_spm_unload(void *model) { delete static_cast<sentencepiece::SentencePieceProcessor *>(model); }

int tgc_spm_vocab(const void *model) {
  return static_cast<const sentencepiece::SentencePieceProcessor *>(model)->GetPieceSize();
}

int tgc_spm_encode(const void *model, const char *text, size_t size, int **ids, size_t *count, char *error,
                   size_t errorSize) {
  std::vector<int> out;
  auto status =
      static_cast<const sentencepiece::SentencePieceProcessor *>(model)->Encode(std::string_view(text, size), &out);
  if (!status.ok())
    return fail(status.ToString(), error, errorSize);
  *ids = copyOut(out.data(), out.size());
  *count = out.size();
  return *ids ? 1 : fail("out of memory", error, errorSize);
}

int tgc_spm_decode(const void *model, const int *ids, size_t count, char **text, size_t *size, char *error,
                   size_t errorSize) {
  std::string out;
  auto status = static_cast<const sentencepiece::SentencePieceProcessor *>(model)->Decode(
      std::vector<int>(ids, ids + count), &out);
  if (!status.ok())
    return fail(status.ToString(), error, errorSize);
  *text = copyOut(out.data(), out.size());
  *size = out.size();
  return *text ? 1 : fail("out of memory", error, errorSize);
}

int tgc_spm_train(const char *corpus, const char *args, size_t argsSize, char **model, size_t *size, char *error,
                  size_t errorSize) {
  std::unordered_map<std::string, std::string> kwargs;
  for (size_t begin = 0; begin < argsSize;) {
    std::string arg(args + begin);
    begin += arg.size() + 1;
    size_t eq = arg.find('=');
    if (eq == std::string::npos)
      return fail("trainer flag '" + arg + "' is not name=value", error, errorSize);
    kwargs[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  LineIterator lines(corpus);
  std::string serialized;
  auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &serialized);
  if (!status.ok())
    return fail(status.ToString(), error, errorSize);
  *model = copyOut(serialized.data(), serialized.size());
  *size = serialized.size();
  return *model ? 1 : fail("out of memory", error, errorSize);
}

void tgc_spm_release(void *buffer) { std::free(buffer); }

} // extern "C"
