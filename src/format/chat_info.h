/* chat_info.h: what a chat template needs from a Hugging Face model's
 * tokenizer files: tokenizer_config.json's chat_template (or the newer
 * chat_template.jinja beside it, which transformers prefers when both
 * exist) and the texts of its bos_token / eos_token. */
#ifndef SPX_CHAT_INFO_H
#define SPX_CHAT_INFO_H

#include "core/err.h"

typedef struct spx_chat_info {
    char *tmpl;         /* NULL: none */
    char *bos, *eos;    /* NULL: the config does not name one (NULL also for null) */
    int has_bos, has_eos; /* the config has the key (null included) */
} spx_chat_info;

/* cfg_json: tokenizer_config.json's text or NULL; jinja: chat_template.jinja's
 * text or NULL. A chat_template that is a list of {name, template} gives
 * the one named "default" (none: no template, with a warning, as
 * transformers refuses to pick). A config that is not JSON is not this
 * module's to report (the tokenizer's loader does): it gives no template. */
spx_status spx_chat_info_parse(const char *cfg_json, const char *jinja, const char *label, spx_chat_info *out,
                               spx_err *e);
void spx_chat_info_free(spx_chat_info *ci);

/* The text of a special-token entry of tokenizer_config.json (j: the value
 * of "bos_token", "eos_token", ...): "<s>" | {"content": "<s>", ...}; NULL
 * for null, a missing key or another shape. Points into j. The one reader
 * of these entries, for the tokenizer's ids and the chat template's texts. */
struct cJSON;
const char *spx_cfg_token_text(const struct cJSON *j);

/* For a .trdc (which carries tokenizer_config.json only): *out is cfg_json
 * with chat_template set to jinja's text (cfg_json NULL: a config holding
 * only that). malloc'd. */
spx_status spx_chat_info_embed(const char *cfg_json, const char *jinja, const char *label, char **out, spx_err *e);

#endif
