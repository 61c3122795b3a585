// The C interface of libtgc_sentencepiece.so (plugins/sentencepiece/), the plugin through which
// tgc reaches SentencePiece (Debian's libsentencepiece-dev). tgc opens it at run time
// (app/SentencePiece.cpp), so that tgc builds and runs where SentencePiece is absent and says so
// only when a SentencePiece tokenizer is asked for. Buffers the plugin returns are malloc'd (tgc_spm_release frees them); an error is
// written into `error` (at most `errorSize` bytes, NUL-terminated) and the call returns 0 / null.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/// The interface's version: a plugin of another is refused.
#define TGC_SPM_ABI 1
int tgc_spm_abi(void);
/// A model from its serialized bytes (a .model file's), or null.
void *tgc_spm_load(const char *bytes, size_t size, char *error, size_t errorSize);
void tgc_spm_unload(void *model);
/// Its pieces (ids 0 to size - 1).
int tgc_spm_vocab(const void *model);
/// The ids of `text` into *ids (*count of them).
int tgc_spm_encode(const void *model, const char *text, size_t size, int **ids, size_t *count, char *error,
                   size_t errorSize);
/// The text of `ids` into *text (*size bytes).
int tgc_spm_decode(const void *model, const int *ids, size_t count, char **text, size_t *size, char *error,
                   size_t errorSize);
/// Trains a model on the lines of `corpus` (a file, read by the plugin: the model records no
/// path) with SentencePiece's trainer flags `args` (name=value, separated by NUL bytes,
/// `argsSize` bytes in all); its serialized bytes into *model (*size bytes). Nothing is written
/// to the disk.
int tgc_spm_train(const char *corpus, const char *args, size_t argsSize, char **model, size_t *size, char *error,
                  size_t errorSize);
void tgc_spm_release(void *buffer);

#ifdef __cplusplus
}
#endif
