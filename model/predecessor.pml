/*
 * A lock renamed with --predecessor-lock (elector/daemon/predecessor.py), for spin.
 * docs/model.md ("The predecessor model") explains it and maps it to the code.
 *
 * Two keys: P, the lock under the name the previous release used, and L, the same lock under its
 * new name.  Three kinds of replica:
 *   OLD    the previous release: P alone (it knows no other name)
 *   NEW    this release with --predecessor-lock P: one lease of both keys, L first, then P;
 *          never a wait while holding one; both renewed in one cycle; validity counted from the
 *          send of the cycle's first request; either key lost is the lease lost
 *   LATER  a later release that dropped the setting: L alone
 * A fleet is two releases side by side (a rolling update or its rollback), N = 2 replicas:
 * OLDNEW (default: old, new), NEWNEW (new, new) or NEWLATER (new, later); N = 3 adds a new one.
 *
 * One process runs the whole system: each pass of the loop takes one enabled event (a replica
 * acts, Redis applies one request, the network loses a request or an answer, the clock ticks),
 * atomically; the invariants are asserted after each.  Time, validity and drift as in lease.pml:
 * a belief ends at the latest AMAX = TTL - JIT ticks after the send it counts from, a key lapses
 * TTL ticks after the request that set or renewed it was applied.  Data loss, pauses and
 * handoffs are lease.pml's business: the composition adds nothing to them.
 *
 * Mutants (spin must find a counterexample in each):
 *   MUT_NO_PREDECESSOR      NEW holds L alone (the rename without the setting)      OLDNEW
 *   MUT_RENEW_ONE           NEW renews L alone; P is left to lapse                  OLDNEW
 *   MUT_VALIDITY_FROM_LAST  NEW counts validity from the send of its LAST acquire   NEWLATER
 */

#ifndef N
#define N 2
#endif
#ifndef MAXG
#define MAXG 4            /* grants per run (both keys): the run ends at the MAXG-th */
#endif
#ifndef MAXL
#define MAXL 1            /* requests or answers lost per run */
#endif
#ifndef TTL
#define TTL 3
#endif
#define DRIFT 1
#define JIT 1
#define MARGIN (DRIFT + JIT)
#define V (TTL - MARGIN)
#define AMAX (V + DRIFT)  /* even the slowest clock says the validity is over here */

#define P 0               /* the predecessor key */
#define L 1               /* the key under the new name */

#define OLD 0
#define NEW 1
#define LATER 2

#ifdef MUT_NO_PREDECESSOR
#define NEEDS(i, k) (rel[i] == OLD -> (k) == P : (k) == L)
#else
#define NEEDS(i, k) (rel[i] == OLD -> (k) == P : (rel[i] == LATER -> (k) == L : 1))
#endif
#ifdef MUT_RENEW_ONE
#define RENEWS(i, k) (NEEDS(i, k) && (rel[i] != NEW || (k) == L))
#else
#define RENEWS(i, k) NEEDS(i, k)
#endif
#define FIRST(i) (NEEDS(i, L) -> L : P)

/* roles */
#define FOL 0             /* follower */
#define ACQ 1             /* acquiring: key at[i] asked */
#define LDR 2             /* leader (believes while lead[i]) */
#define STEP 3            /* stepped down: releasing what it holds */

#define RQ_NONE 0
#define RQ_ACQ 1
#define RQ_REN 2
#define RQ_REL 3
#define AN_NONE 0
#define AN_GRANTED 1
#define AN_HELD 2
#define AN_RENEWED 3
#define AN_LOST 4
#define AN_DONE 5
#define AN_TIMEOUT 6      /* the request or its answer was lost: the client's timeout */

#define S(i, k) ((i) * 2 + (k))
#define INC(x, cap) x = ((x) < (cap) -> (x) + 1 : (x))

byte rel[N];
byte role[N];
bit  lead[N];
byte vage[N];             /* age of the send its validity is counted from */
byte sage[N];             /* age of the send of its cycle under way */
byte at[N];
byte mv[2 * N];           /* the grant id (lease value) it holds on each key; 0: none */
byte rq[2 * N];           /* its request in flight on each key */
byte an[2 * N];           /* the answer in flight */
byte ag[2 * N];
bit  renok[2 * N];        /* RENEWED answers of the renewal under way */

byte kh[2];               /* holder + 1; 0: no key */
byte kv[2];               /* its value (grant id) */
byte kttl[2];
byte gid;
byte losses;

#define IDLE(i) (rq[S(i, P)] == RQ_NONE && rq[S(i, L)] == RQ_NONE \
                 && an[S(i, P)] == AN_NONE && an[S(i, L)] == AN_NONE)
#define HOLDS(i) (mv[S(i, P)] != 0 || mv[S(i, L)] != 0)
/* Property 1: one leader at a time, whichever release. */
#define BOTH(a, b) (lead[a] && lead[b])
#if N == 2
#define EXCLUSIVE (!BOTH(0, 1))
#define ALL_BACKED (BACKED(0) && BACKED(1))
#else
#define EXCLUSIVE (!BOTH(0, 1) && !BOTH(0, 2) && !BOTH(1, 2))
#define ALL_BACKED (BACKED(0) && BACKED(1) && BACKED(2))
#endif
/* Property 2: a replica believes only while every key it needs is its own on Redis. */
#define OWN(i, k) (!NEEDS(i, k) || (kh[k] == (i) + 1 && kv[k] == mv[S(i, k)]))
#define BACKED(i) (!lead[i] || (OWN(i, P) && OWN(i, L)))

inline check() {
  assert(EXCLUSIVE);
#ifndef EXCLUSIVE_ONLY  /* the mutants' runs: a counterexample of property 1 itself */
  assert(ALL_BACKED)
#endif
}

/* ---- a replica acts (machine.py's cycles over predecessor.py's lease) ------------------------- */
inline candidate(i) {
  if
  /* follower: first give back what an earlier term or attempt left (predecessor.py's
     leftovers: after the step-down, so never while it believes), then contend */
  :: role[i] == FOL && IDLE(i) && mv[S(i, L)] != 0 -> rq[S(i, L)] = RQ_REL;
     printf("MSC: c%d releases its leftover L\n", i)
  :: role[i] == FOL && IDLE(i) && mv[S(i, L)] == 0 && mv[S(i, P)] != 0 -> rq[S(i, P)] = RQ_REL;
     printf("MSC: c%d releases its leftover P\n", i)
  :: role[i] == FOL && IDLE(i) && !HOLDS(i) ->
     role[i] = ACQ; at[i] = FIRST(i); sage[i] = 0; rq[S(i, at[i])] = RQ_ACQ;
     printf("MSC: c%d sends ACQUIRE of key %d\n", i, at[i])
  /* an acquire's answer */
  :: role[i] == ACQ && an[S(i, at[i])] != AN_NONE ->
     if
     :: an[S(i, at[i])] == AN_GRANTED ->
        mv[S(i, at[i])] = ag[S(i, at[i])];
        an[S(i, at[i])] = AN_NONE;
        if
        :: at[i] == L && NEEDS(i, P) ->
           at[i] = P; rq[S(i, P)] = RQ_ACQ;
#ifdef MUT_VALIDITY_FROM_LAST
           sage[i] = 0;
#endif
           printf("MSC: c%d has L, sends ACQUIRE of P\n", i)
        :: else ->
           role[i] = LDR; vage[i] = sage[i]; lead[i] = (vage[i] < AMAX);
           printf("MSC: c%d leads: %d (send %d ticks ago)\n", i, lead[i], vage[i])
        fi
     :: else ->
        /* held or timed out: whatever the attempt got is a leftover, given back first */
        an[S(i, at[i])] = AN_NONE; role[i] = FOL;
        printf("MSC: c%d not granted key %d\n", i, at[i])
     fi
  /* leader: renew every key at once, while it believes */
  :: role[i] == LDR && lead[i] && IDLE(i) ->
     sage[i] = 0; renok[S(i, P)] = 0; renok[S(i, L)] = 0;
     if :: RENEWS(i, P) -> rq[S(i, P)] = RQ_REN :: else fi;
     if :: RENEWS(i, L) -> rq[S(i, L)] = RQ_REN :: else fi;
     printf("MSC: c%d sends RENEW\n", i)
  /* a renewal's answers, one key at a time */
  :: role[i] == LDR && an[S(i, P)] != AN_NONE -> renewal_answer(i, P)
  :: role[i] == LDR && an[S(i, L)] != AN_NONE -> renewal_answer(i, L)
  /* leader: step down at any moment (renew deadline, a fast clock, shutdown...): belief first */
  :: role[i] == LDR && IDLE(i) -> lead[i] = 0; role[i] = STEP;
     printf("MSC: c%d steps down\n", i)
  /* release: L, then P (predecessor.py's release) */
  :: role[i] == STEP && IDLE(i) && mv[S(i, L)] != 0 -> rq[S(i, L)] = RQ_REL
  :: role[i] == STEP && IDLE(i) && mv[S(i, L)] == 0 && mv[S(i, P)] != 0 -> rq[S(i, P)] = RQ_REL
  :: role[i] == STEP && IDLE(i) && !HOLDS(i) -> role[i] = FOL
  /* a release's answer (DONE or TIMEOUT): forgotten either way; an unreleased key lapses */
  :: (role[i] == FOL || role[i] == STEP) && an[S(i, P)] != AN_NONE -> mv[S(i, P)] = 0; an[S(i, P)] = AN_NONE
  :: (role[i] == FOL || role[i] == STEP) && an[S(i, L)] != AN_NONE -> mv[S(i, L)] = 0; an[S(i, L)] = AN_NONE
  fi
}

inline renewal_answer(i, k) {
  if
  :: an[S(i, k)] == AN_LOST ->
     /* either key lost is the lease lost; the other stays a leftover until the step-down */
     lead[i] = 0; mv[S(i, k)] = 0; role[i] = FOL;
     printf("MSC: c%d LOST key %d\n", i, k)
  :: an[S(i, k)] == AN_RENEWED -> renok[S(i, k)] = 1
  :: else -> skip  /* a failed renewal: belief runs out unless the next one succeeds */
  fi;
  an[S(i, k)] = AN_NONE;
  if
  :: role[i] == LDR && lead[i] && (renok[S(i, P)] || !RENEWS(i, P)) && (renok[S(i, L)] || !RENEWS(i, L)) ->
     vage[i] = sage[i]; lead[i] = (vage[i] < AMAX); renok[S(i, P)] = 0; renok[S(i, L)] = 0;
     printf("MSC: c%d RENEWED, believes %d\n", i, lead[i])
  :: else
  fi
}

/* ---- Redis applies a request (the ACQUIRE / RENEW / RELEASE scripts, one key each) ------------ */
inline apply(i, k) {
  if
  :: rq[S(i, k)] == RQ_ACQ ->
     if
     :: kh[k] == 0 -> gid++; kh[k] = i + 1; kv[k] = gid; kttl[k] = TTL; an[S(i, k)] = AN_GRANTED; ag[S(i, k)] = gid
     :: else -> an[S(i, k)] = AN_HELD
     fi
  :: rq[S(i, k)] == RQ_REN ->
     if
     :: kh[k] == i + 1 && kv[k] == mv[S(i, k)] -> kttl[k] = TTL; an[S(i, k)] = AN_RENEWED
     :: else -> an[S(i, k)] = AN_LOST  /* never re-creates a lapsed key */
     fi
  :: rq[S(i, k)] == RQ_REL ->
     if
     :: kh[k] == i + 1 && kv[k] == mv[S(i, k)] -> kh[k] = 0; kv[k] = 0; kttl[k] = 0
     :: else
     fi;
     an[S(i, k)] = AN_DONE
  fi;
  rq[S(i, k)] = RQ_NONE;
  printf("MSC: redis applies c%d's request on key %d: answer %d\n", i, k, an[S(i, k)])
}

/* the network loses a request before Redis applied it, or its answer after */
inline lose(s) {
  if
  :: rq[s] != RQ_NONE -> rq[s] = RQ_NONE; an[s] = AN_TIMEOUT
  :: an[s] != AN_NONE && an[s] != AN_TIMEOUT -> an[s] = AN_TIMEOUT
  fi;
  losses++
}

inline tick() {
  for (j : 0 .. N - 1) {
    if :: role[j] == FOL -> sage[j] = 0 :: else -> INC(sage[j], AMAX) fi;
    if
    :: lead[j] -> INC(vage[j], AMAX); if :: vage[j] >= AMAX -> lead[j] = 0 :: else fi
    :: else -> vage[j] = 0
    fi
  }
  for (j : 0 .. 1) {
    if
    :: kttl[j] > 0 -> kttl[j]--; if :: kttl[j] == 0 -> kh[j] = 0; kv[j] = 0 :: else fi
    :: else
    fi
  }
  printf("MSC: -- tick --\n")
}

init {
  byte j;
  atomic {
#if defined(NEWLATER)
    rel[0] = NEW; rel[1] = LATER;
#elif defined(NEWNEW)
    rel[0] = NEW; rel[1] = NEW;
#else
    rel[0] = OLD; rel[1] = NEW;
#endif
#if N > 2
    rel[2] = NEW;
#endif
  }
  do
  :: atomic { candidate(0); check() }
  :: atomic { candidate(1); check() }
#if N > 2
  :: atomic { candidate(2); check() }
#endif
  :: atomic { gid < MAXG && rq[S(0, P)] != RQ_NONE -> apply(0, P); check() }
  :: atomic { gid < MAXG && rq[S(0, L)] != RQ_NONE -> apply(0, L); check() }
  :: atomic { gid < MAXG && rq[S(1, P)] != RQ_NONE -> apply(1, P); check() }
  :: atomic { gid < MAXG && rq[S(1, L)] != RQ_NONE -> apply(1, L); check() }
#if N > 2
  :: atomic { gid < MAXG && rq[S(2, P)] != RQ_NONE -> apply(2, P); check() }
#endif
#if N > 2
  :: atomic { gid < MAXG && rq[S(2, L)] != RQ_NONE -> apply(2, L); check() }
#endif
  :: gid >= MAXG -> break
  :: atomic { losses < MAXL && (rq[S(0, P)] != RQ_NONE || (an[S(0, P)] != AN_NONE && an[S(0, P)] != AN_TIMEOUT)) -> lose(S(0, P)) }
  :: atomic { losses < MAXL && (rq[S(0, L)] != RQ_NONE || (an[S(0, L)] != AN_NONE && an[S(0, L)] != AN_TIMEOUT)) -> lose(S(0, L)) }
  :: atomic { losses < MAXL && (rq[S(1, P)] != RQ_NONE || (an[S(1, P)] != AN_NONE && an[S(1, P)] != AN_TIMEOUT)) -> lose(S(1, P)) }
  :: atomic { losses < MAXL && (rq[S(1, L)] != RQ_NONE || (an[S(1, L)] != AN_NONE && an[S(1, L)] != AN_TIMEOUT)) -> lose(S(1, L)) }
#if N > 2
  :: atomic { losses < MAXL && (rq[S(2, P)] != RQ_NONE || (an[S(2, P)] != AN_NONE && an[S(2, P)] != AN_TIMEOUT)) -> lose(S(2, P)) }
#endif
#if N > 2
  :: atomic { losses < MAXL && (rq[S(2, L)] != RQ_NONE || (an[S(2, L)] != AN_NONE && an[S(2, L)] != AN_TIMEOUT)) -> lose(S(2, L)) }
#endif
  :: atomic { tick(); check() }
  od
}
