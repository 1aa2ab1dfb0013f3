/* sampler.h: the sampler's distribution and random numbers, for the
 * speculative acceptance rule (engine/spec.c), which must accept and
 * resample from exactly the distribution spx_sample draws from. */
#ifndef SPX_ENGINE_SAMPLER_H
#define SPX_ENGINE_SAMPLER_H

#include "spectra.h"

typedef struct spx_cand { float p; int32_t id; } spx_cand;

/* The candidates spx_sample(logits, vocab, p) draws from: c[0 .. n) by
 * descending weight (ties: lower id first), c[i].p the unnormalised weight
 * exp((logit - max) / T), *sum their double sum; returns n >= 1. c holds
 * vocab entries, malloc'd (it holds the sort keys meanwhile; c[n..vocab)
 * are left unspecified). p must be a sampling
 * (not greedy) parameter set. Top-k selects the k candidates and sorts
 * only them; without top-k the whole vocabulary is radix-sorted: the same
 * order, weights and sums as one full comparison sort, so the same draws
 * (tests/test_sampler.c keeps that sort as the reference). */
int64_t spx_sampler_dist(const float *logits, int64_t vocab, const spx_sampler_params *p, spx_cand *c, double *sum);
/* A uniform double in [0, 1) from 53 bits of the RNG (spx_sample's draw). */
double spx_rng_uniform(uint64_t *rng);
/* Whether p makes spx_sample an argmax. */
int spx_sampler_greedy(const spx_sampler_params *p);

#endif
