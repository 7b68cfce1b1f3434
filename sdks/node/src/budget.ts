/**
 * The retry budget: a token bucket shared by every call of one wrapped `fetch`.
 *
 * "At most 3 attempts" bounds what one call can do, not what a fleet does. When a dependency
 * goes down every call fails and every one retries: 1,000 requests a second become 3,000,
 * arriving when the dependency is least able to serve them. A budget sees all calls: each retry
 * spends tokens from a shared bucket, successes put tokens back. While most calls succeed the
 * bucket stays full; when most fail it drains after a bounded number of retries and failures
 * are returned at once; when the dependency recovers, successes refill it and retries resume
 * by themselves.
 *
 * The numbers follow the AWS SDKs' standard retry mode ("Retry behavior", AWS SDKs and Tools
 * Reference Guide), the same as the Rust SDK (`oncely-client`): a bucket of **500** tokens; a
 * retry after a transient error (a 5xx, a timeout, a reset connection) costs **14**; a retry
 * after throttling (429, or the server's `idempotency_request_in_flight`) costs **5**; a call
 * that succeeds on its first attempt refunds **1**; a call that succeeds after a retry refunds
 * that retry's cost. A full bucket pays for `500 / 14 = 35` transient retries under a total
 * outage, then none.
 *
 * @module
 */

/** Which price a retry pays: `'transient'` (default 14 tokens) or `'throttle'` (default 5). */
export type RetryCost = 'transient' | 'throttle';

/** The numbers of a {@link RetryBudget}; all amounts are in tokens. */
export interface BudgetConfig {
  /** Capacity and initial fill of the bucket. Default 500. */
  readonly capacity: number;
  /** What a retry after a transient error costs. Default 14. */
  readonly transientCost: number;
  /** What a retry after throttling costs. Default 5. */
  readonly throttleCost: number;
  /** What a success on the first attempt refunds. Default 1. */
  readonly successRefund: number;
}

/** The default budget: capacity 500, transient retry 14, throttle retry 5, success refund 1. */
export const DEFAULT_BUDGET: BudgetConfig = Object.freeze({
  capacity: 500,
  transientCost: 14,
  throttleCost: 5,
  successRefund: 1,
});

/** The result of {@link RetryBudget.tryWithdraw}. */
export type Withdrawal =
  | { readonly ok: true; readonly left: number; readonly cost: number }
  | { readonly ok: false; readonly available: number; readonly cost: number };

function tokens(name: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) {
    throw new RangeError(`oncely: budget ${name} must be an integer >= 0 (tokens), got ${String(value)}`);
  }
  return value;
}

/**
 * A token bucket. One is made for each `withRetries` call (shared by every call of the
 * function it returns); pass the same instance as `budget` to several wrapped functions to
 * share it between them.
 *
 * JavaScript runs one call's bookkeeping at a time, so withdrawals never overdraw it.
 */
export class RetryBudget {
  /** The configuration. */
  readonly config: BudgetConfig;
  #tokens: number;

  /**
   * A full bucket.
   *
   * @throws RangeError when an amount is not an integer `>= 0`.
   */
  constructor(config: Partial<BudgetConfig> = {}) {
    const merged = { ...DEFAULT_BUDGET, ...config };
    this.config = Object.freeze({
      capacity: tokens('capacity', merged.capacity),
      transientCost: tokens('transientCost', merged.transientCost),
      throttleCost: tokens('throttleCost', merged.throttleCost),
      successRefund: tokens('successRefund', merged.successRefund),
    });
    this.#tokens = this.config.capacity;
  }

  /** Tokens currently in the bucket. */
  get available(): number {
    return this.#tokens;
  }

  /** The price of one retry of this kind, in tokens. */
  cost(kind: RetryCost): number {
    return kind === 'throttle' ? this.config.throttleCost : this.config.transientCost;
  }

  /**
   * Pays for one retry. Returns the tokens left and the price paid, or, when the bucket holds
   * fewer tokens than the retry costs, `ok: false` with what was available (nothing is taken).
   */
  tryWithdraw(kind: RetryCost): Withdrawal {
    const cost = this.cost(kind);
    if (this.#tokens < cost) return { ok: false, available: this.#tokens, cost };
    this.#tokens -= cost;
    return { ok: true, left: this.#tokens, cost };
  }

  /**
   * Records a successful logical call: refunds the price of its last retry when it was retried
   * (`lastRetryCost`), else the first-attempt refund. Never above capacity.
   */
  onSuccess(lastRetryCost?: number): void {
    this.deposit(lastRetryCost ?? this.config.successRefund);
  }

  /** Adds tokens, never above capacity. */
  deposit(amount: number): void {
    if (!(amount > 0)) return;
    this.#tokens = Math.min(this.config.capacity, this.#tokens + amount);
  }
}
