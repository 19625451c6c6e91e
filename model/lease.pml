/*
 * elector's lease protocol as implemented, for spin.  docs/model.md explains the model, its
 * bounds and the map to the code (elector/backend/lua/lease.py, elector/election/machine.py,
 * elector/election/timing.py).
 *
 * One process runs the whole system: each pass of the loop takes one enabled event (a candidate
 * acts, Redis applies a request, the network loses one, a fault, a replication step, or the
 * clock ticks).  Every event is atomic; the invariants are asserted after each.
 *
 * Time is discrete.  One TICK is the smallest duration the protocol distinguishes: the ttl is
 * TTL ticks, and the safety margin (1% ttl + 5 ms + stop-work time in timing.py) is MARGIN
 * ticks, split into the clock drift it absorbs (DRIFT) and the pause it absorbs (JIT).  Ages
 * count ticks since an event on Redis's clock and saturate, so runs are unbounded in length.
 *
 * Configurations (-D):
 *   RESTARTS   faults: the primary restarts empty, or from an old RDB snapshot
 *   FAILOVERS  faults: a failover to a lagging replica, and a failback
 *   LIVE       no faults, losses or pauses; prompt delivery; followers retry when their wait
 *              ends or a release is announced: checks the liveness properties
 *   MIXED      a mixed fleet: candidate 0 speaks protocol 1 (cbaaac6: no meta hash, lost data
 *              seen by the counter and the run_id only); property 1 is then checked for the
 *              grants to protocol-2 candidates (a protocol-1 grant on a failback is protocol 1's
 *              own bug, docs/protocol.md); no losses (the other runs check them)
 *   MAXG, MAXF, MAXP   grants, faults, pauses per run
 * Mutants (each removes one safety mechanism; spin must then find a counterexample):
 *   MUT_VALIDITY_FROM_ANSWER  validity counted from the answer instead of the send
 *   MUT_NO_QUIET              no quiet period after lost data
 *   MUT_FAILBACK_RUNID_ONLY   lost data detected by the run_id only (no master_replid)
 *   MUT_NO_RUNID              lost data detected by the master_replid only (no run_id)
 *   MUT_RENEW_RECREATES       a renewal of a missing key re-creates it
 *   MUT_NO_DRIFT_MARGIN       the safety margin leaves the clock drift out
 *   MUT_TOKEN_NO_CLOCK        fencing tokens without the server-clock floor
 *   MUT_RELEASE_ANY           a release deletes the key without the owner check
 *   MUT_NO_ANNOUNCE           a release is not announced (LIVE)
 *   MUT_SERVED_ANY_STREAM     protocol 1's served quiet period is credited without checking
 *                             that this server was promoted straight out of the recorded
 *                             stream (master_replid2): the failback after a failover (MIXED)
 *   MUT_NO_META_TRUSTED       without a stream in the meta hash, the server key is trusted on
 *                             a promoted server too (MIXED)
 */

#ifndef N
#define N 2
#endif
#ifndef MAXG
#define MAXG 3            /* grants per run: the run ends after the MAXG-th grant */
#endif
#ifndef MAXF
#define MAXF 2            /* data-loss faults per run */
#endif
#ifndef MAXP
#define MAXP 1            /* process pauses per run, each of any length */
#endif

#ifndef TTL
#define TTL    5          /* lease ttl, ticks */
#endif
#define DRIFT  1          /* the most a candidate's clock may be off over one ttl, ticks */
#define JIT    1          /* the longest pause the margin absorbs, ticks */
#ifdef MUT_NO_DRIFT_MARGIN
#define MARGIN JIT
#else
#define MARGIN (DRIFT + JIT)
#endif
#define V      (TTL - MARGIN)  /* validity: believes while its own clock says age < V */
#define AMAX   (V + DRIFT)     /* ages saturate: even the slowest clock says "over" here */
#define LIVE_START_BOUND (TTL + 1)  /* LIVE: someone leads by this tick */
#define LIVE_RELEASE_BOUND 1        /* LIVE: someone leads within this many ticks of a release */

/* roles */
#define FOL  0            /* follower: contends */
#define LDR  1            /* leader (believes while lead[i]) */
#define STEP 2            /* stepped down, release pending */
#define OFF  3            /* stopped after its release (LIVE) */

/* requests */
#define RQ_NONE 0
#define RQ_ACQ  1
#define RQ_REN  2
#define RQ_REL  3

/* answers */
#define AN_NONE      0
#define AN_GRANTED   1
#define AN_HELD      2
#define AN_QUIET     3
#define AN_STANDBACK 4
#define AN_RENEWED   5
#define AN_LOST      6
#define AN_RELEASED  7
#define AN_NOTOURS   8

/* release kinds (LIVE; the safety runs need only plain releases, see docs/model.md) */
#define RK_PLAIN    0     /* renew deadline, lease expired, resign: contend again */
#define RK_SHUTDOWN 1     /* stop(): the candidate leaves */
#define RK_HANDOFF  2     /* hand over to the next candidate; `from` stands back */

/* ---- candidates ------------------------------------------------------------------------------ */
byte role[N];
bit  lead[N];             /* believes it leads: its clock says its validity has not run out */
byte vage[N];             /* age of the send time its validity is counted from */
byte lgid[N];             /* grant id of the lease it holds: the lease value */
byte req[N];              /* its request in flight (not applied yet) */
byte rkind[N];            /* ... release kind */
byte rage[N];             /* age of the send time of its request / answer in flight */
byte ans[N];              /* the answer in flight */
byte agid[N];
byte atok[N];
byte aval[N];             /* LIVE: pttl of HELD / QUIET / STANDBACK, ticks */
bit  unc[N];              /* its last acquire's answer was lost: the retry reuses the owner token */
#ifdef MUT_TOKEN_NO_CLOCK
byte seen_tok[N];         /* highest fencing token seen in answers (ACQUIRE ARGV[7]) */
#define SEEN_TOK(i) seen_tok[i]
#define SAW_TOK(i, t) seen_tok[i] = MAX(seen_tok[i], t)
#else
/* With the server-clock floor the seen-token term never decides a token in the model (the
   floor is above every token after a data loss; the counter is, otherwise): left out. */
#define SEEN_TOK(i) 0
#define SAW_TOK(i, t) skip
#endif
#ifdef MUT_TOKEN_NO_CLOCK
#define SET_KTOK(s, t) ktok[s] = t
#else
#define SET_KTOK(s, t) skip  /* only answers read it, for the seen-token term */
#endif
bit  acted[N];            /* sent a request this tick (at most one per tick) */
bit  paused[N];
byte plen[N];             /* ticks of the current pause (saturates at JIT + 1) */
bit  excused[N];          /* paused longer than the margin absorbs, during this validity */
bit  lp[N];               /* a long pause since its last send */
byte wait[N];             /* LIVE: ticks until a follower looks again */
bit  woke[N];             /* LIVE: a release was announced since its last send */
byte pauses;

/* ---- Redis: data of server 0, server 1, and an RDB snapshot (slot 2) --------------------------- */
#define SNAP 2
byte khold[3];            /* lease key: holder + 1; 0 = no key */
byte kgid[3];             /* its value (grant id) */
bit  kcur[3];             /* its owner token is its holder's current one (adoption) */
byte kttl[3];
byte ktok[3];             /* its fencing token */
byte ctr[3];              /* fencing counter; 0 = missing */
byte srec[3];             /* server key: the run_id recorded; 0 = missing */
byte qttl[3];             /* quiet-period key ttl; 0 = none */
bit  meta[3];             /* meta hash exists ... */
byte mrid[3];             /* ... its replid */
byte mrun[3];             /* ... and the run_id recorded beside it */
byte hfrom[3];            /* LIVE: handoff key: from + 1, 0 = none */
byte hto[3];              /* ... to + 1, 0 = anyone but from */
byte httl[3];
byte runid[2];            /* run_id of each server process */
byte rid[2];              /* its master_replid */
byte rid2[2];             /* its master_replid2: the replid it had until its last promotion */
byte pri;                 /* the primary (the server the candidates talk to) */
byte nextid;              /* fresh run_ids and replids */
byte faults;
bit  copied;              /* the replica synced (once per primary) / the snapshot was taken (once) */

/* ---- history, for the properties ------------------------------------------------------------ */
byte gid;                 /* grants so far; grant ids are 1..MAXG */
byte maxtok;              /* highest fencing token granted */
byte sclk;                /* the server clock's part of a token (docs/model.md) */
byte ended;               /* bit g: lease g was released or lapsed on the primary */
byte ticks;               /* LIVE: ticks since the start (saturating) */
bit  everled;             /* LIVE */
bit  gone;                /* LIVE: a candidate has shut down (one may; one must stay) */
byte relwait;             /* LIVE: ticks since a release with nobody leading since; 0 = none */

#define MAX(a, b) ((a) > (b) -> (a) : (b))
#ifdef MUT_NO_META_TRUSTED
#define UNPROMOTED(s) true
#else
#define UNPROMOTED(s) (rid2[s] == 0)
#endif
#ifdef MIXED
#define P1(i) ((i) == 0)  /* candidate 0 speaks protocol 1 */
#else
#define P1(i) false
#endif
#define INC(x, cap) x = ((x) < (cap) -> (x) + 1 : (x))
#define DEC(x) x = ((x) > 0 -> (x) - 1 : 0)

/* Property 1: never two candidates inside their believed validity, unless one of them was kept
   from seeing its validity end by a pause longer than the margin absorbs (excused).  MIXED: the
   newer of the two leases (the higher grant id) went to a protocol-2 candidate. */
#ifdef MIXED
#define OVERLAP2(a, b) (lead[a] && lead[b] && !excused[a] && !excused[b] \
                        && !P1(lgid[a] > lgid[b] -> a : b))
#else
#define OVERLAP2(a, b) (lead[a] && lead[b] && !excused[a] && !excused[b])
#endif
#if N == 2
#define EXCLUSIVE (!OVERLAP2(0, 1))
#else
#define EXCLUSIVE (!OVERLAP2(0, 1) && !OVERLAP2(0, 2) && !OVERLAP2(1, 2))
#endif

/* Property 4: a lease that was released or lapsed never comes back through a request (a
   data-loss event, no request, may restore an old copy) */
#if MAXF == 0
#define NO_REVIVAL (had || khold[pri] == 0 || !(ended & (1 << kgid[pri])))
#define ENDED(g) ended = ended | (1 << (g))
#else
#define NO_REVIVAL true   /* checked in the runs without data loss only */
#define ENDED(g) skip
#endif

#define ALIVE(k) (role[k] != OFF && !(role[k] == STEP && rkind[k] == RK_SHUTDOWN))
#ifdef LIVE
#define WOKEN(i) (wait[i] == 0)
#else
#define WOKEN(i) true
#endif

inline check() {
  assert(EXCLUSIVE)
}

/* machine.py: valid_until = sent + validity_s; is_leader = now < valid_until */
inline start_belief(i) {
#ifdef MUT_VALIDITY_FROM_ANSWER
  vage[i] = 0;
#else
  vage[i] = rage[i];
#endif
  lead[i] = (vage[i] < AMAX);
  excused[i] = lp[i];
#ifdef LIVE
  if
  :: lead[i] -> everled = 1; relwait = 0
  :: else
  fi
#endif
}

inline to_follower(i) {
  role[i] = (rkind[i] == RK_SHUTDOWN -> OFF : FOL); rkind[i] = RK_PLAIN; lgid[i] = 0
}

inline send(i, kind) {
  req[i] = kind; rage[i] = 0; lp[i] = 0; acted[i] = 1; woke[i] = 0
}

/* a new random owner token: no key of ours carries it */
inline new_token(i) {
  if :: khold[0] == i + 1 -> kcur[0] = 0 :: else fi;
  if :: khold[1] == i + 1 -> kcur[1] = 0 :: else fi;
  if :: khold[SNAP] == i + 1 -> kcur[SNAP] = 0 :: else fi
}

/* ---- a candidate acts (machine.py) ----------------------------------------------------------- */
inline candidate(i) {
  if
  /* follower: contend (_follower_cycle -> ACQUIRE) */
  :: role[i] == FOL && !paused[i] && !acted[i] && req[i] == RQ_NONE && ans[i] == AN_NONE && WOKEN(i) ->
     if
     :: !unc[i] -> new_token(i); unc[i] = 1
     :: else     /* redis_lease.py: after a lost answer, retry with the same owner token */
     fi;
     send(i, RQ_ACQ);
     printf("MSC: c%d sends ACQUIRE\n", i)
  /* leader: renew while it believes (_leader_cycle -> RENEW) */
  :: role[i] == LDR && lead[i] && !paused[i] && !acted[i] && req[i] == RQ_NONE && ans[i] == AN_NONE ->
     send(i, RQ_REN);
     printf("MSC: c%d sends RENEW of lease %d\n", i, lgid[i])
  /* leader: step down (renew deadline, validity over, a fast clock, resign, handoff,
     preemption, stop): stop believing first, then release (_begin_step_down, then
     _release_cycle).  A withheld release (on_stopped_leading raised) is this step with the
     release lost. */
  :: role[i] == LDR && !paused[i] && req[i] == RQ_NONE && ans[i] == AN_NONE ->
     lead[i] = 0; role[i] = STEP; rkind[i] = RK_PLAIN;
#ifdef LIVE
     /* someone must stay to take over; a handoff goes to a live candidate */
     if
     :: skip
     :: !gone -> rkind[i] = RK_SHUTDOWN; gone = 1
     :: ALIVE((i + 1) % N) -> rkind[i] = RK_HANDOFF
     fi;
#endif
     printf("MSC: c%d steps down (release kind %d)\n", i, rkind[i])
  :: role[i] == STEP && !paused[i] && !acted[i] && req[i] == RQ_NONE && ans[i] == AN_NONE ->
     send(i, RQ_REL);
     printf("MSC: c%d sends RELEASE of lease %d\n", i, lgid[i])
  /* an answer arrives */
  :: !paused[i] && ans[i] != AN_NONE ->
     if
     :: ans[i] == AN_GRANTED ->
        unc[i] = 0;
        SAW_TOK(i, atok[i]);
        role[i] = LDR; lgid[i] = agid[i];
        start_belief(i);
        printf("MSC: c%d GRANTED lease %d, believes %d (send was %d ticks ago)\n", i, agid[i], lead[i], rage[i])
     :: ans[i] == AN_HELD || ans[i] == AN_QUIET || ans[i] == AN_STANDBACK ->
        unc[i] = 0;
        SAW_TOK(i, atok[i]);
#ifdef LIVE
        /* wake at send + pttl (jitter aside), or at once after a release announcement */
        wait[i] = (aval[i] > rage[i] && !woke[i] -> aval[i] - rage[i] : 0);
#endif
        printf("MSC: c%d told %d (2 held, 3 quiet period, 4 stand back)\n", i, ans[i])
     :: ans[i] == AN_RENEWED && role[i] == LDR && lead[i] ->
        start_belief(i);
        printf("MSC: c%d RENEWED lease %d, believes %d\n", i, lgid[i], lead[i])
     :: ans[i] == AN_RENEWED && !(role[i] == LDR && lead[i]) ->
        /* the renewal's await ends by the renew deadline (< validity): too late, dropped */
        skip
     :: ans[i] == AN_LOST ->
        printf("MSC: c%d LOST lease %d\n", i, lgid[i]);
        lead[i] = 0; to_follower(i)
     :: ans[i] == AN_RELEASED || ans[i] == AN_NOTOURS ->
        printf("MSC: c%d release answered (7 released, 8 not ours): %d\n", i, ans[i]);
        to_follower(i)
     fi;
     ans[i] = AN_NONE; agid[i] = 0; atok[i] = 0; aval[i] = 0
#ifndef LIVE
  /* a process pause of any length (SIGSTOP, GC, a frozen VM) */
  :: !paused[i] && pauses < MAXP -> paused[i] = 1; plen[i] = 0; pauses++;
     printf("MSC: c%d paused\n", i)
  :: paused[i] -> paused[i] = 0;
     /* on resume the clock is read first (_leader_cycle checks valid_until first) */
     if
     :: lead[i] && vage[i] >= AMAX -> lead[i] = 0
     :: else
     fi;
     printf("MSC: c%d resumes after %d ticks\n", i, plen[i])
#endif
  fi
}

/* ---- Redis applies a request (scripts.py) ------------------------------------------------------ */
inline answer(i, kind, g, tok, val) {
#ifdef LIVE
  ans[i] = kind;
#else
  /* outside LIVE, answers with the same effect on the candidate are one answer */
  ans[i] = (kind == AN_QUIET || kind == AN_STANDBACK -> AN_HELD : (kind == AN_NOTOURS -> AN_RELEASED : kind));
#endif
  agid[i] = g;
#ifdef MUT_TOKEN_NO_CLOCK
  atok[i] = tok;
#endif
#ifdef LIVE
  aval[i] = val
#endif
}

/* ACQUIRE, past the lost-data check: a handoff may exclude us, else a grant */
inline grant_or_stand_back(i, s) {
  if
  :: hfrom[s] != 0 && httl[s] > 0 && (hfrom[s] == i + 1 || (hto[s] != 0 && hto[s] != i + 1)) ->
     answer(i, AN_STANDBACK, 0, 0, httl[s])
  :: else ->
     /* token = max(counter + 1, server clock, highest seen + 1) */
     tok = ctr[s] + 1;
     tok = MAX(tok, SEEN_TOK(i) + 1);
#ifndef MUT_TOKEN_NO_CLOCK
     tok = MAX(tok, sclk);
#endif
     assert(tok > maxtok);       /* Property 2: fencing tokens of successive grants increase */
     maxtok = tok;
     ctr[s] = tok;
     gid++;
     khold[s] = i + 1; kgid[s] = gid; kcur[s] = 1; kttl[s] = TTL; SET_KTOK(s, tok);
     hfrom[s] = 0; hto[s] = 0; httl[s] = 0;
     if
     :: !P1(i) -> meta[s] = 1; mrid[s] = rid[s]; mrun[s] = runid[s]
     :: else     /* protocol 1 has no meta hash */
     fi;
     answer(i, AN_GRANTED, gid, tok, 0);
     printf("MSC: redis (server %d) grants lease %d, token %d, to c%d\n", s, gid, tok, i);
     tok = 0
  fi
}

/* ACQUIRE, held or quiet: a protocol-2 contender that finds no stream in the meta hash (a lock
   protocol 1 alone used) records it, when the lost-data check would pass (note_stream) */
inline note_stream(i, s) {
  if
  :: !P1(i) && !meta[s] && ctr[s] != 0 && srec[s] == runid[s] && UNPROMOTED(s) ->
     meta[s] = 1; mrid[s] = rid[s]; mrun[s] = runid[s]
  :: else
  fi
}

inline acquire(i, s) {
  if
  :: khold[s] == i + 1 && kcur[s] && unc[i] ->
     /* carries our owner token: an earlier attempt was granted, its answer lost: adopt */
     kttl[s] = TTL;
     answer(i, AN_GRANTED, kgid[s], ktok[s], 0);
     printf("MSC: redis adopts lease %d for c%d\n", kgid[s], i)
  :: khold[s] != 0 && !(khold[s] == i + 1 && kcur[s] && unc[i]) ->
     note_stream(i, s);
     answer(i, AN_HELD, 0, ktok[s], kttl[s])
  :: khold[s] == 0 && qttl[s] > 0 ->
     note_stream(i, s);
     answer(i, AN_QUIET, 0, 0, qttl[s])
  :: khold[s] == 0 && qttl[s] == 0 ->
     lost = (ctr[s] == 0);
#ifndef MUT_NO_RUNID
     lost = lost || (srec[s] != runid[s]);
#endif
#ifndef MUT_FAILBACK_RUNID_ONLY
     /* a promotion (failover or failback), unless protocol 1 served the quiet period for this
        very promotion (`served`: its run_id recorded, another one in the meta hash, and this
        server promoted straight out of the recorded stream; only MIXED runs can take it) */
#ifdef MUT_SERVED_ANY_STREAM
#define SERVED(s) (srec[s] == runid[s] && mrun[s] != 0 && mrun[s] != runid[s])
#else
#define SERVED(s) (srec[s] == runid[s] && mrun[s] != 0 && mrun[s] != runid[s] && mrid[s] == rid2[s])
#endif
     lost = lost || (!P1(i) && meta[s] && mrid[s] != rid[s] && !SERVED(s));
     /* no stream recorded: the server key is trusted on a server never promoted since it started */
     lost = lost || (!P1(i) && !meta[s] && !UNPROMOTED(s));
#endif
     if
     :: lost ->
        if
        :: ctr[s] == 0 ->
#ifdef MUT_TOKEN_NO_CLOCK
           ctr[s] = MAX(1, SEEN_TOK(i))
#else
           ctr[s] = MAX(sclk, SEEN_TOK(i))
#endif
        :: else
        fi;
        srec[s] = runid[s];
        if
        :: !P1(i) -> meta[s] = 1; mrid[s] = rid[s]; mrun[s] = runid[s]
        :: else
        fi;
#ifndef MUT_NO_QUIET
        qttl[s] = TTL;
        answer(i, AN_QUIET, 0, 0, TTL);
        printf("MSC: redis (server %d) sees lost data: quiet period of %d ticks\n", s, TTL)
#else
        printf("MSC: redis (server %d) sees lost data: no quiet period (mutant)\n", s);
        grant_or_stand_back(i, s)
#endif
     :: else -> grant_or_stand_back(i, s)
     fi;
     lost = 0
  fi
}

inline renew(i, s, g) {
  if
  :: khold[s] != 0 && kgid[s] == g ->
     kttl[s] = TTL;              /* PEXPIRE: the ttl is replaced */
     answer(i, AN_RENEWED, 0, 0, 0)
#ifdef MUT_RENEW_RECREATES
  :: khold[s] == 0 ->
     khold[s] = i + 1; kgid[s] = g; kcur[s] = 0; kttl[s] = TTL; ktok[s] = 0;
     answer(i, AN_RENEWED, 0, 0, 0)
  :: khold[s] != 0 && kgid[s] != g ->
     answer(i, AN_LOST, 0, 0, 0)
#else
  :: !(khold[s] != 0 && kgid[s] == g) ->
     answer(i, AN_LOST, 0, 0, 0)
#endif
  fi
}

inline release(i, s, g, kind) {
  if
#ifdef MUT_RELEASE_ANY
  :: khold[s] != 0 ->
#else
  :: khold[s] != 0 && kgid[s] == g ->
#endif
     ENDED(kgid[s]);
     khold[s] = 0; kgid[s] = 0; kcur[s] = 0; kttl[s] = 0; ktok[s] = 0;
#ifdef LIVE
     if
     :: kind == RK_HANDOFF ->
        hfrom[s] = i + 1; httl[s] = TTL; hto[s] = (i + 1) % N + 1
#if N > 2
     :: kind == RK_HANDOFF -> hfrom[s] = i + 1; httl[s] = TTL; hto[s] = 0
#endif
     :: else
     fi;
     relwait = 1;
#ifndef MUT_NO_ANNOUNCE
     /* the release announcement wakes every follower (_apply_announcements) */
     for (j : 0 .. N - 1) { wait[j] = 0; woke[j] = 1 }
     j = 0;
#endif
#endif
     answer(i, AN_RELEASED, 0, 0, 0);
     printf("MSC: redis releases lease %d\n", g)
  :: else ->
     answer(i, AN_NOTOURS, 0, 0, 0)
  fi
}

inline apply(i) {
  had = (khold[pri] != 0);
  if
  :: req[i] == RQ_ACQ -> acquire(i, pri)
  :: req[i] == RQ_REN -> renew(i, pri, lgid[i])
  :: req[i] == RQ_REL -> release(i, pri, lgid[i], rkind[i])
  fi;
  assert(NO_REVIVAL);
  req[i] = RQ_NONE; had = 0
}

/* the network loses a request or its answer: the client times out and goes on */
inline lose(i) {
  if
  :: req[i] != RQ_NONE ->
     if :: req[i] == RQ_REL -> to_follower(i) :: else fi;
     req[i] = RQ_NONE
  :: ans[i] != AN_NONE ->
     if :: ans[i] == AN_RELEASED || ans[i] == AN_NOTOURS -> to_follower(i) :: else fi;
     ans[i] = AN_NONE; agid[i] = 0; atok[i] = 0; aval[i] = 0
  fi
}

/* ---- data: copies between servers and the snapshot ------------------------------------------ */
inline copy_data(from, to) {
  khold[to] = khold[from]; kgid[to] = kgid[from]; kcur[to] = kcur[from];
  kttl[to] = kttl[from]; ktok[to] = ktok[from];
  ctr[to] = ctr[from]; srec[to] = srec[from]; qttl[to] = qttl[from];
  meta[to] = meta[from]; mrid[to] = mrid[from]; mrun[to] = mrun[from]
}

inline wipe(s) {
  khold[s] = 0; kgid[s] = 0; kcur[s] = 0; kttl[s] = 0; ktok[s] = 0;
  ctr[s] = 0; srec[s] = 0; qttl[s] = 0; meta[s] = 0; mrid[s] = 0; mrun[s] = 0
}

/* a server that lost data has a clock past every token issued before (docs/model.md) */
inline lost_data() {
  faults++;
  sclk = maxtok + 1
}

/* ---- the clock ticks ------------------------------------------------------------------------ */
inline tick_candidate(i) {
  INC(vage[i], AMAX);
  /* only a grant's or a renewal's send time counts */
  if
  :: req[i] == RQ_ACQ || req[i] == RQ_REN || ans[i] == AN_GRANTED || ans[i] == AN_RENEWED -> INC(rage[i], AMAX)
  :: else -> rage[i] = 0
  fi;
  if
  :: paused[i] ->
     INC(plen[i], JIT + 1);
     if
     :: lead[i] && plen[i] > JIT -> excused[i] = 1; lp[i] = 1
     :: else
     fi
  :: else ->
     /* even the slowest clock allowed says the validity is over at AMAX */
     if
     :: lead[i] && vage[i] >= AMAX -> lead[i] = 0
     :: else
     fi
  fi;
  /* forget what no longer matters, so that equal situations are one state */
  if :: !lead[i] -> vage[i] = 0; excused[i] = 0 :: else fi;
  if :: !paused[i] -> plen[i] = 0 :: else fi;
  acted[i] = 0;
#ifdef LIVE
  DEC(wait[i])
#endif
}

inline tick_server(s) {
  DEC(kttl[s]);
  if
  :: khold[s] != 0 && kttl[s] == 0 ->
     if :: s == pri -> ENDED(kgid[s]) :: else fi;
     khold[s] = 0; kgid[s] = 0; kcur[s] = 0; ktok[s] = 0
  :: else
  fi;
  DEC(qttl[s]);
  DEC(httl[s]);
  if :: httl[s] == 0 -> hfrom[s] = 0; hto[s] = 0 :: else fi
}

#ifdef LIVE
/* LIVE: requests are applied and answered within their tick, and a due candidate acts */
#define DUE(i) (req[i] != RQ_NONE || ans[i] != AN_NONE \
                || (role[i] == FOL && wait[i] == 0 && !acted[i]) || (role[i] == STEP && !acted[i]) \
                || (role[i] == LDR && !lead[i]))
#if N == 2
#define SETTLED (!DUE(0) && !DUE(1))
#else
#define SETTLED (!DUE(0) && !DUE(1) && !DUE(2))
#endif
#else
#define SETTLED true
#endif

inline tick() {
  printf("MSC: -- tick --\n");
  for (j : 0 .. N - 1) { tick_candidate(j) }
  j = 0;
  tick_server(0);
#ifdef FAILOVERS
  tick_server(1);
#endif
#ifdef RESTARTS
  tick_server(SNAP);
#endif
#ifdef LIVE
  INC(ticks, LIVE_START_BOUND + 1);
  /* Property 3: with no faults, some candidate leads within LIVE_START_BOUND ticks */
  assert(everled || ticks <= LIVE_START_BOUND);
  if
  :: relwait > 0 ->
     /* Property 5: after a release, a waiting candidate leads without waiting for the ttl */
     assert(relwait <= LIVE_RELEASE_BOUND);
     relwait++
  :: else
  fi
#endif
}

init {
  byte j, tok;
  bit lost, had;
  atomic {
    runid[0] = 1; runid[1] = 2; rid[0] = 3; rid[1] = 3; nextid = 4; pri = 0;
    sclk = 1;     /* the server clock (ms since the epoch) is above 0 */
  }
  do
  /* candidates act */
  :: atomic { candidate(0); check() }
  :: atomic { candidate(1); check() }
#if N > 2
  :: atomic { candidate(2); check() }
#endif
  /* Redis applies a request; the run ends after the MAXG-th grant */
  :: atomic { gid < MAXG && req[0] != RQ_NONE -> apply(0); check() }
  :: atomic { gid < MAXG && req[1] != RQ_NONE -> apply(1); check() }
#if N > 2
  :: atomic { gid < MAXG && req[2] != RQ_NONE -> apply(2); check() }
#endif
  :: gid >= MAXG -> break
#if !defined(LIVE) && !defined(MIXED)
  :: atomic { lose(0) }
  :: atomic { lose(1) }
#if N > 2
  :: atomic { lose(2) }
#endif
#endif
#ifdef FAILOVERS
  /* replication: the replica catches up with the primary (until then it lags) */
  :: atomic { faults < MAXF && !copied -> copy_data(pri, 1 - pri); rid[1 - pri] = rid[pri]; copied = 1;
       printf("MSC: server %d (replica) syncs from server %d\n", 1 - pri, pri) }
  /* a failover to the replica, lagging or not; a second one is a failback to the old
     primary, which may lag behind too */
  :: atomic { faults < MAXF -> lost_data(); pri = 1 - pri; rid2[pri] = rid[pri]; rid[pri] = nextid;
       nextid++; copied = 0;
       printf("MSC: FAULT failover to server %d\n", pri); check() }
#endif
#ifdef RESTARTS
  /* an RDB snapshot of the primary */
  :: atomic { faults < MAXF && !copied -> copy_data(pri, SNAP); copied = 1;
       printf("MSC: snapshot of server %d\n", pri) }
  /* the primary restarts empty (new run_id, new replid) */
  :: atomic { faults < MAXF -> lost_data(); wipe(pri); runid[pri] = nextid; rid[pri] = nextid + 1;
       rid2[pri] = 0; nextid = nextid + 2; printf("MSC: FAULT primary %d restarts empty\n", pri); check() }
  /* the primary restarts from the snapshot (new run_id; the replid may come back from the RDB) */
  :: atomic { faults < MAXF -> lost_data(); copy_data(SNAP, pri); runid[pri] = nextid;
       if :: rid2[pri] = rid[pri]; rid[pri] = nextid + 1 :: rid2[pri] = 0; rid[pri] = nextid + 1 :: skip fi;
       nextid = nextid + 2; printf("MSC: FAULT primary %d restarts from the snapshot\n", pri); check() }
#endif
  /* time passes */
  :: atomic { SETTLED -> tick(); check() }
  od
}
