package main

// ratio is one quotient across the rounds: each round's own ratio, so
// that both sides of every quotient saw the same machine.
type ratio struct {
	phase, name string
	clients     int
	kind        ratioKind
	values      []float64
	rounds      []int
}

// ratioKind is what a ratio divides.
type ratioKind int

const (
	// ratioRates is num's rate ÷ den's: above 1, num is faster.
	ratioRates ratioKind = iota
	// ratioCosts is den's rate ÷ num's, a ratio of times per call or
	// transaction: above 1, num costs more.
	ratioCosts
	// ratioServerCPU is num's server CPU per call, job or transaction,
	// on the run's behalf, ÷ den's: above 1, num costs the server more.
	ratioServerCPU
	// ratioServerCPUAll is ratioServerCPU of the whole server's CPU, for
	// the floor, whose pgbench backends end before the share of the run
	// can be read.
	ratioServerCPUAll
)

// serverCPU reports whether the kind divides server CPU.
func (k ratioKind) serverCPU() bool { return k == ratioServerCPU || k == ratioServerCPUAll }

// serverCPUPrefix begins the name of every server CPU ratio, in the CSV
// as in the printout.
const serverCPUPrefix = "server CPU: "

// ratioDef defines a ratio of kind between two variants.
type ratioDef struct {
	name             string
	numPhase, numVar string
	denPhase, denVar string
	clients          int
	kind             ratioKind
}

// drainRatio is a ratio between two drains.
func drainRatio(name, num, den string, kind ratioKind) ratioDef {
	return ratioDef{name: name, numPhase: phaseDrain, numVar: num, denPhase: phaseDrain, denVar: den, kind: kind}
}

// enqueueRatio is a ratio between two enqueue blocks at clients.
func enqueueRatio(name, num, den string, clients int, kind ratioKind) ratioDef {
	return ratioDef{name: name, numPhase: phaseEnqueue, numVar: num, denPhase: phaseEnqueue, denVar: den, clients: clients, kind: kind}
}

// floorRatio is a ratio of a measurement of phase to the pgbench model.
func floorRatio(name, phase, num string, kind ratioKind) ratioDef {
	return ratioDef{name: name, numPhase: phase, numVar: num, denPhase: phaseFloor, denVar: floorPgbench, kind: kind}
}

// ratioDefs are the ratios the summary gives, where both sides ran.
func ratioDefs(s settings) []ratioDef {
	cpu := func(def ratioDef) ratioDef {
		def.name = serverCPUPrefix + def.name
		def.kind = ratioServerCPU
		return def
	}
	wholeServer := func(def ratioDef) ratioDef {
		def.name += ", whole server"
		def.kind = ratioServerCPUAll
		return def
	}
	tunedPgx := drainRatio("drain tuned: pgonce ÷ river", drainPgonceTuned, drainRiverTuned, ratioRates)
	tunedSQL := drainRatio("drain tuned database/sql: pgonce ÷ river", drainPgonceTunedSQL, drainRiverTunedSQL, ratioRates)
	unanalyzedPgx := drainRatio("drain never analyzed: pgonce ÷ river tuned", drainPgonceFreshUnanalyzed, drainRiverTuned, ratioRates)
	unanalyzedSQL := drainRatio("drain never analyzed database/sql: pgonce ÷ river tuned", drainPgonceFreshUnanalyzedSQL, drainRiverTunedSQL, ratioRates)
	defs := []ratioDef{
		tunedPgx,
		tunedSQL,
		unanalyzedPgx,
		unanalyzedSQL,
		drainRatio("drain defaults: pgonce ÷ river", drainPgonceDefault, drainRiverDefault, ratioRates),
		drainRatio("drain: pgonce defaults ÷ pgonce tuned", drainPgonceDefault, drainPgonceTuned, ratioRates),
		drainRatio("drain: limits set ÷ no limits, pgonce tuned", drainPgonceLimited, drainPgonceTuned, ratioRates),
		drainRatio("drain tuned, pgonce: database/sql ÷ pgx", drainPgonceTunedSQL, drainPgonceTuned, ratioRates),
		drainRatio("drain tuned, river: database/sql ÷ pgx", drainRiverTunedSQL, drainRiverTuned, ratioRates),
		drainRatio("drain never analyzed ÷ analyzed, hash key index", drainPgonceFreshUnanalyzed, drainPgonceFreshAnalyzed, ratioRates),
		drainRatio("drain never analyzed ÷ analyzed, primary key", drainPgoncePkeyUnanalyzed, drainPgoncePkeyAnalyzed, ratioRates),
		drainRatio("drain never analyzed: hash key index ÷ primary key", drainPgonceFreshUnanalyzed, drainPgoncePkeyUnanalyzed, ratioRates),
		// The analyzed side is the tuned drain in the harness's own schema,
		// not a fresh one: the database/sql drain has no fresh analyzed
		// variant of its own.
		drainRatio("drain never analyzed (fresh) ÷ tuned, database/sql", drainPgonceFreshUnanalyzedSQL, drainPgonceTunedSQL, ratioRates),
		cpu(tunedPgx),
		cpu(tunedSQL),
		cpu(unanalyzedPgx),
		cpu(unanalyzedSQL),
	}
	for _, clients := range s.enqueueClients {
		uniquePgx := enqueueRatio("enqueue: pgonce pgx ÷ river unique", enqueuePgoncePgx, enqueueRiverUnique, clients, ratioRates)
		uniqueSQL := enqueueRatio("enqueue: pgonce database/sql ÷ river unique database/sql", enqueuePgonceSQL, enqueueRiverUniqueSQL, clients, ratioRates)
		many := enqueueRatio("enqueue 10 calls a tx: SubmitManyTx ÷ river InsertManyTx unique", enqueuePgonceMany, enqueueRiverManyUnique, clients, ratioRates)
		defs = append(defs,
			uniquePgx,
			uniqueSQL,
			many,
			enqueueRatio("enqueue 10 calls a tx: SubmitManyTx ÷ 10x SubmitTx", enqueuePgonceMany, enqueuePgonceEach, clients, ratioRates),
			enqueueRatio("enqueue: pgonce database/sql ÷ river unique", enqueuePgonceSQL, enqueueRiverUnique, clients, ratioRates),
			enqueueRatio("enqueue: pgonce pgx ÷ river plain", enqueuePgoncePgx, enqueueRiver, clients, ratioRates),
			enqueueRatio("tx cost: SubmitTx pgx ÷ bare pgx", enqueuePgoncePgx, enqueueBarePgx, clients, ratioCosts),
			enqueueRatio("tx cost: SubmitTx database/sql ÷ bare database/sql", enqueuePgonceSQL, enqueueBareSQL, clients, ratioCosts),
			enqueueRatio("tx cost: river unique ÷ bare pgx", enqueueRiverUnique, enqueueBarePgx, clients, ratioCosts),
			enqueueRatio("tx cost: river unique database/sql ÷ bare database/sql", enqueueRiverUniqueSQL, enqueueBareSQL, clients, ratioCosts),
			cpu(uniquePgx),
			cpu(uniqueSQL),
			cpu(many),
		)
	}
	endToEnd := ratioDef{name: "end to end: pgonce ÷ river", numPhase: phaseEndToEnd, numVar: endToEndPgonce, denPhase: phaseEndToEnd, denVar: endToEndRiver}
	floorPgonce := floorRatio("floor: pgonce tuned drain ÷ pgbench model", phaseDrain, drainPgonceTuned, ratioRates)
	floorRiver := floorRatio("floor: river tuned drain ÷ pgbench model", phaseDrain, drainRiverTuned, ratioRates)
	return append(defs,
		endToEnd,
		floorPgonce,
		floorRatio("floor: pgonce defaults drain ÷ pgbench model", phaseDrain, drainPgonceDefault, ratioRates),
		floorRiver,
		floorRatio("floor: end to end pgonce ÷ pgbench model", phaseEndToEnd, endToEndPgonce, ratioRates),
		cpu(endToEnd),
		wholeServer(cpu(floorPgonce)),
		wholeServer(cpu(floorRiver)),
	)
}

// ratios returns every ratio of defs both of whose sides ran in at least
// one round, each from the rounds both ran in.
func (rs *resultSet) ratios(s settings) []ratio {
	var out []ratio
	for _, def := range ratioDefs(s) {
		q := ratio{phase: def.numPhase, name: def.name, clients: def.clients, kind: def.kind}
		for round := range s.rounds {
			num, ok1 := rs.find(round, def.numPhase, def.numVar, def.clients)
			den, ok2 := rs.find(round, def.denPhase, def.denVar, denClients(def))
			if !ok1 || !ok2 {
				continue
			}
			v, ok := def.value(num, den)
			if !ok {
				continue
			}
			q.values = append(q.values, v)
			q.rounds = append(q.rounds, round)
		}
		if len(q.values) > 0 {
			out = append(out, q)
		}
	}
	return out
}

// value is the ratio of num to den, false when one side lacks the figure
// (a server CPU not measured).
func (def ratioDef) value(num, den result) (float64, bool) {
	switch def.kind {
	case ratioCosts:
		return den.rate() / num.rate(), true
	case ratioServerCPU, ratioServerCPUAll:
		n, d := num.serverCPUPerCall(), den.serverCPUPerCall()
		if def.kind == ratioServerCPUAll {
			n, d = num.serverCPUAllPerCall(), den.serverCPUAllPerCall()
		}
		if n <= 0 || d <= 0 {
			return 0, false
		}
		return n / d, true
	default:
		return num.rate() / den.rate(), true
	}
}

// denClients is the client count of a ratio's denominator: the floor and
// the other phases have none.
func denClients(def ratioDef) int {
	if def.denPhase == phaseEnqueue {
		return def.clients
	}
	return 0
}
