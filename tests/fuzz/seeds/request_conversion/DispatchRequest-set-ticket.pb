

learners1desk<
c1learner
set_ticket*!{"ticket":"lamp","status":"done"}