/* chat_render.c: spx_chat_render (spectra.h): a conversation to a prompt
 * through the model's chat template (or another), with the variables
 * transformers' apply_chat_template passes. */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static spx_status fail_msg(char *err, size_t cap, spx_status st, const char *msg) {
    if (cap) snprintf(err, cap, "%s", msg);
    return st;
}

spx_status spx_chat_render(const spx_model *m, const spx_template *t, const char *messages_json,
                           const char *tools_json, int add_generation_prompt, char **out, size_t *out_len, char *err,
                           size_t errcap) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (errcap) err[0] = 0;
    cJSON *msgs = messages_json ? cJSON_Parse(messages_json) : NULL;
    if (!cJSON_IsArray(msgs)) {
        cJSON_Delete(msgs);
        return fail_msg(err, errcap, SPX_ERR_ARG, "chat: the messages are not a JSON array");
    }
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (tools_json && !cJSON_IsArray(tools)) {
        cJSON_Delete(msgs);
        cJSON_Delete(tools);
        return fail_msg(err, errcap, SPX_ERR_ARG, "chat: the tools are not a JSON array");
    }
    cJSON *ctx = cJSON_CreateObject();
    char *ctx_text = NULL;
    if (ctx && cJSON_AddItemToObject(ctx, "messages", msgs)) msgs = NULL;
    if (ctx && tools && cJSON_AddItemToObject(ctx, "tools", tools)) tools = NULL;
    if (!ctx || msgs || tools || !cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt != 0) ||
        !cJSON_AddStringToObject(ctx, "bos_token", spx_model_bos_text(m)) ||
        !cJSON_AddStringToObject(ctx, "eos_token", spx_model_eos_text(m)) || !(ctx_text = cJSON_PrintUnformatted(ctx))) {
        cJSON_Delete(msgs);
        cJSON_Delete(tools);
        cJSON_Delete(ctx);
        return fail_msg(err, errcap, SPX_ERR_NOMEM, "chat: out of memory");
    }
    cJSON_Delete(ctx);
    spx_template *own = NULL;
    spx_status st = SPX_OK;
    if (!t) { /* the model's own (parsed per call: a few microseconds beside any forward pass) */
        const char *src = spx_model_chat_template(m);
        const char *name = src ? "tokenizer_config.json chat_template" : "the built-in ChatML template";
        if (!src) src = SPX_CHATML_TEMPLATE;
        st = spx_template_parse(src, strlen(src), name, &own, err, errcap);
        t = own;
    }
    if (st == SPX_OK) st = spx_template_render(t, ctx_text, out, out_len, err, errcap);
    spx_template_free(own);
    free(ctx_text);
    return st;
}
