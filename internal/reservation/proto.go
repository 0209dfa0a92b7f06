package reservation

import "github.com/basalt-storage/basalt/pkg/api"

// The MDS API's messages for the model (pkg/api: PRState, PRAction, PRNexus).

// NexusProto returns n as the API's message.
func NexusProto(n Nexus) *api.PRNexus {
	return &api.PRNexus{Initiator: n.Initiator, TargetPort: uint32(n.TargetPort), AllTargetPorts: n.AllTargetPorts}
}

// NexusFromProto is the inverse of NexusProto.
func NexusFromProto(p *api.PRNexus) Nexus {
	return Nexus{Initiator: p.GetInitiator(), TargetPort: uint16(p.GetTargetPort()), AllTargetPorts: p.GetAllTargetPorts()}
}

// Proto returns s as the API's message.
func (s *State) Proto() *api.PRState {
	p := &api.PRState{Generation: s.Generation, Reserved: s.Reserved, Type: uint32(s.Type),
		Aptpl: s.APTPL, Seq: s.Seq}
	if s.Holder != (Nexus{}) {
		p.Holder = NexusProto(s.Holder)
	}
	if s.SPC2 != nil {
		p.Spc2Holder = NexusProto(*s.SPC2)
	}
	for _, r := range s.Registrations {
		p.Registrations = append(p.Registrations, &api.PRRegistration{Nexus: NexusProto(r.Nexus), Key: r.Key})
	}
	for _, a := range s.Attentions {
		p.Attentions = append(p.Attentions, &api.PRAttention{Seq: a.Seq, Nexus: NexusProto(a.Nexus), Ascq: uint32(a.ASCQ), Abort: a.Abort})
	}
	return p
}

// StateFromProto is the inverse of State.Proto (nil: no state).
func StateFromProto(p *api.PRState) *State {
	s := &State{Generation: p.GetGeneration(), Reserved: p.GetReserved(), Type: Type(p.GetType()),
		APTPL: p.GetAptpl(), Seq: p.GetSeq()}
	if p.GetHolder() != nil {
		s.Holder = NexusFromProto(p.Holder)
	}
	if p.GetSpc2Holder() != nil {
		n := NexusFromProto(p.Spc2Holder)
		s.SPC2 = &n
	}
	for _, r := range p.GetRegistrations() {
		s.Registrations = append(s.Registrations, Registration{Nexus: NexusFromProto(r.Nexus), Key: r.Key})
	}
	for _, a := range p.GetAttentions() {
		s.Attentions = append(s.Attentions, Attention{Seq: a.Seq, Nexus: NexusFromProto(a.Nexus), ASCQ: byte(a.Ascq), Abort: a.Abort})
	}
	return s
}

// Proto returns a as the API's message.
func (a Action) Proto() *api.PRAction {
	return &api.PRAction{ServiceAction: uint32(a.ServiceAction), Type: uint32(a.Type), Key: a.Key,
		ServiceActionKey: a.SAKey, Aptpl: a.APTPL, AllTargetPorts: a.AllTargetPort, SpecIPt: a.SpecIPT}
}

// ActionFromProto is the inverse of Action.Proto. Out-of-range numbers
// become invalid service actions and types, which Apply refuses.
func ActionFromProto(p *api.PRAction) Action {
	sa, typ := p.GetServiceAction(), p.GetType()
	if sa > 0xff {
		sa = 0xff
	}
	if typ > 0xff {
		typ = 0
	}
	return Action{ServiceAction: ServiceAction(sa), Type: Type(typ), Key: p.GetKey(),
		SAKey: p.GetServiceActionKey(), APTPL: p.GetAptpl(), AllTargetPort: p.GetAllTargetPorts(), SpecIPT: p.GetSpecIPt()}
}
