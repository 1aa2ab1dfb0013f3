/* chat_info.c: the chat template and BOS/EOS texts of tokenizer_config.json
 * (see chat_info.h). */
#include "format/chat_info.h"
#include "core/util.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

const char *spx_cfg_token_text(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "content") : NULL;
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

spx_status spx_chat_info_parse(const char *cfg_json, const char *jinja, const char *label, spx_chat_info *out,
                               spx_err *e) {
    memset(out, 0, sizeof *out);
    cJSON *cfg = cfg_json ? cJSON_Parse(cfg_json) : NULL;
    const char *names[2] = {"bos_token", "eos_token"};
    char **dst[2] = {&out->bos, &out->eos};
    int *has[2] = {&out->has_bos, &out->has_eos};
    for (int i = 0; i < 2 && cJSON_IsObject(cfg); i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, names[i]);
        if (!j) continue;
        *has[i] = 1;
        const char *text = spx_cfg_token_text(j);
        if (text && !(*dst[i] = spx_strdup(text))) goto oom;
    }
    if (jinja) {
        if (!(out->tmpl = spx_strdup(jinja))) goto oom;
    } else if (cJSON_IsObject(cfg)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(t)) {
            if (!(out->tmpl = spx_strdup(t->valuestring))) goto oom;
        } else if (cJSON_IsArray(t)) { /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
            const cJSON *it;
            cJSON_ArrayForEach(it, t) {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, "template");
                if (cJSON_IsString(n) && !strcmp(n->valuestring, "default") && cJSON_IsString(v)) {
                    if (!(out->tmpl = spx_strdup(v->valuestring))) goto oom;
                    break;
                }
            }
            if (!out->tmpl)
                spx_log(SPX_LOG_WARN, "%s: tokenizer_config.json lists chat templates but none named 'default'; "
                                      "give one with --chat-template", label);
        } else if (t && !cJSON_IsNull(t)) {
            spx_log(SPX_LOG_WARN, "%s: tokenizer_config.json: chat_template is neither a string nor a list; ignored",
                    label);
        }
    }
    cJSON_Delete(cfg);
    return SPX_OK;
oom:
    cJSON_Delete(cfg);
    spx_chat_info_free(out);
    return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
}

void spx_chat_info_free(spx_chat_info *ci) {
    free(ci->tmpl);
    free(ci->bos);
    free(ci->eos);
    memset(ci, 0, sizeof *ci);
}

spx_status spx_chat_info_embed(const char *cfg_json, const char *jinja, const char *label, char **out, spx_err *e) {
    *out = NULL;
    cJSON *cfg = cfg_json ? cJSON_Parse(cfg_json) : cJSON_CreateObject();
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tokenizer_config.json is not a JSON object", label);
    }
    cJSON *v = cJSON_CreateString(jinja);
    if (!v || (cJSON_GetObjectItemCaseSensitive(cfg, "chat_template")
                   ? !cJSON_ReplaceItemInObjectCaseSensitive(cfg, "chat_template", v)
                   : !cJSON_AddItemToObject(cfg, "chat_template", v))) {
        cJSON_Delete(v);
        cJSON_Delete(cfg);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    }
    *out = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    return *out ? SPX_OK : spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
}
